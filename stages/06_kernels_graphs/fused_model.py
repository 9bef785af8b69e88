"""Stage 01's transformer with fewer, bigger kernels: same weights, same math, fewer launches.

What changes, per layer (the unfused count in brackets; each kernel's file counts its bytes):

* q, k and v projections are one matmul on weights concatenated at load time [3 matmuls];
  gate and up likewise [2]. Same FLOPs, one pass over the activations instead of three/two.
* the residual add and the next RMSNorm are one kernel [~8 launches] (fused_norm.py); Qwen3's
  q/k norm is the same kernel over rows of one head each, before RoPE.
* RoPE rotates q and k in place in one launch [~10] (rotary.py), or inside the KV write's launch
  beside a backend that offers it (`rotary_in_kv_write`: the gpu kernel set's).
* silu(gate) * up is one kernel [2, and a temporary between them] (silu_mul.py).

`ops` does the fused work: `TorchOps` (PyTorch, the reference), the Triton backend's `TritonOps`
or a room's. The engine hands the model its backend once (`follow`): the model takes its ops, and its whole-layer
kernels where it offers them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.rope import apply_rope

if TYPE_CHECKING:
    from .backend_base import KernelBackend


class TorchOps:
    @staticmethod
    def rms_norm(x, weight, eps):
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    @classmethod
    def add_rms_norm(cls, x, residual, weight, eps):
        residual = x + residual
        return cls.rms_norm(residual, weight, eps), residual

    @staticmethod
    def rotary_(q, k, cos, sin):
        q.copy_(apply_rope(q, cos, sin))
        k.copy_(apply_rope(k, cos, sin))

    @staticmethod
    def silu_mul(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def merged_linear(*parts: nn.Linear) -> nn.Linear:
    """One Linear whose output is the parts' outputs side by side."""
    weight = torch.cat([p.weight for p in parts])
    bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out


class FusedLayer(nn.Module):
    def __init__(self, layer, config):
        super().__init__()
        a = layer.self_attn
        self.layer_idx, self.n_heads, self.n_kv, self.d = a.layer_idx, a.n_heads, a.n_kv_heads, a.head_dim
        self.qkv = merged_linear(a.q_proj, a.k_proj, a.v_proj)
        self.o_proj = a.o_proj
        # an MoE layer keeps stage 01's block: its router, and its experts through the backend's kernel
        self.moe = layer.mlp if config.is_moe_layer(self.layer_idx) else None
        self.gate_up = None if self.moe else merged_linear(layer.mlp.gate_proj, layer.mlp.up_proj)
        self.down_proj = None if self.moe else layer.mlp.down_proj
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight
        self.q_norm = a.q_norm.weight if a.q_norm is not None else None  # Qwen3's, per head
        self.k_norm = a.k_norm.weight if a.k_norm is not None else None
        self.eps = config.rms_norm_eps

    def forward(self, x, residual, cos, sin, attn, meta, ops, rotary_in_attn=False):
        """x: this layer's input delta; residual: the stream so far (None before layer 0).
        rotary_in_attn: `attn` rotates q and k itself, in its KV write (`rotary_forward`)."""
        if residual is None:
            residual, h = x, ops.rms_norm(x, self.input_norm, self.eps)
        else:
            h, residual = ops.add_rms_norm(x, residual, self.input_norm, self.eps)
        t, d = h.shape[0], self.d
        qkv = self.qkv(h)
        q = qkv[:, : self.n_heads * d].view(t, self.n_heads, d)  # strided views: no copies
        k = qkv[:, self.n_heads * d: (self.n_heads + self.n_kv) * d].view(t, self.n_kv, d)
        v = qkv[:, (self.n_heads + self.n_kv) * d:].view(t, self.n_kv, d)
        if self.q_norm is not None:  # one row per head: [t * heads, d]
            q = ops.rms_norm(q.reshape(-1, d), self.q_norm, self.eps).view(t, self.n_heads, d)
            k = ops.rms_norm(k.reshape(-1, d), self.k_norm, self.eps).view(t, self.n_kv, d)
        if rotary_in_attn:
            out = attn.rotary_forward(self.layer_idx, q, k, v, cos, sin, meta)
        else:
            ops.rotary_(q, k, cos, sin)
            out = attn.forward(self.layer_idx, q, k, v, meta)
        x = self.o_proj(out.reshape(t, -1))
        h, residual = ops.add_rms_norm(x, residual, self.post_norm, self.eps)
        if self.moe is not None:
            return self.moe(h, attn), residual
        return self.down_proj(ops.silu_mul(self.gate_up(h))), residual


class FusedCausalLM(nn.Module):
    """Drop-in for stage 01's CausalLM (same forward/compute_logits), built from one."""

    def __init__(self, model: CausalLM, ops=TorchOps):
        super().__init__()
        self.config, self.ops = model.config, ops
        self.layer_kernels = None  # whole layers in one call each, a backend's (follow)
        self.rotary_in_attn = False  # the backend rotates q and k in its KV write (follow)
        self.embed_tokens, self.rotary_emb = model.model.embed_tokens, model.model.rotary_emb
        self.layers = nn.ModuleList(FusedLayer(layer, model.config) for layer in model.model.layers)
        self.final_norm, self.lm_head = model.model.norm.weight, model.lm_head
        self.tap_layers: tuple[int, ...] = ()  # as stage 01's Decoder: layers a drafter also reads
        self.tapped: torch.Tensor | None = None

    def follow(self, backend: KernelBackend) -> "FusedCausalLM":
        """Run beside `backend`: its ops for the small work, and its layer kernels if it offers
        any (asked once, after the linears took their final form: split or int8), and RoPE
        inside its KV write where it offers that."""
        self.ops, self.rotary_in_attn = backend.fused_ops, backend.rotary_in_kv_write
        self.layer_kernels = backend.layer_kernels(self)
        return self

    def forward(self, input_ids, attn, meta):
        x, residual = self.embed_tokens(input_ids), None
        cos, sin = self.rotary_emb(meta.positions)
        whole_layer = self.layer_kernels.step(attn, x, cos, sin, meta) if self.layer_kernels else None
        taps = []
        for i, layer in enumerate(self.layers):
            if whole_layer:
                x, residual = whole_layer(layer, x, residual)
            else:
                x, residual = layer(x, residual, cos, sin, attn, meta, self.ops, self.rotary_in_attn)
            if i in self.tap_layers:  # the layer's output is the residual stream: x + residual
                taps.append(x + residual)
        self.tapped = torch.cat(taps, dim=-1) if taps else None
        return self.ops.add_rms_norm(x, residual, self.final_norm, self.config.rms_norm_eps)[0]

    def compute_logits(self, hidden):
        logits = self.layer_kernels.logits(hidden) if self.layer_kernels else None
        return logits if logits is not None else self.lm_head(hidden).float()

    @property
    def device(self):  # the embedding, not the lm_head: an int8 lm_head has no float weight
        return self.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.embed_tokens.weight.dtype
