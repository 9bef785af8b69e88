"""Stage 01's transformer with fewer, bigger kernels: same weights, same math, fewer launches.

What changes, per layer (the unfused count in brackets):

* q, k and v projections are one matmul on weights concatenated at load time [3 matmuls];
  gate and up likewise [2]. Same FLOPs, one pass over the activations instead of three/two,
  and on a GPU fewer launches (which is what a small model's decode step is made of).
* the residual add and the next RMSNorm are one kernel: read x and the residual once, write
  the sum and the normed sum [add, pow, mean, add, rsqrt, mul, cast, mul: ~8 launches, each
  reading and writing the whole row].
* RoPE rotates q and k in place, in one launch [~10 elementwise ops and their temporaries].

`ops` picks who does the fused work: "torch" (plain PyTorch, the reference; merged weights
only), "triton" (fused_norm.py and rotary.py) or "cpu" (cpu_ops.c: C loops for the CPU).
The attention backend is independent. With the cpu ops and the cpu attention backend, each
layer of a step runs as one C call (cpu_layer.py; `one_call_layers=False` keeps the per-op
path, which is what its tests compare it with).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.rope import apply_rope

from . import cpu_layer
from .cpu_layer import LayerCalls, LayerWeights, layer_weight, product
from .cpu_ops import CpuOps


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


class TritonOps:
    @staticmethod
    def rms_norm(x, weight, eps):
        from .fused_norm import rms_norm
        return rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x, residual, weight, eps):
        from .fused_norm import fused_add_rms_norm
        return fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def rotary_(q, k, cos, sin):
        from .rotary import apply_rotary_
        apply_rotary_(q, k, cos, sin)

    silu_mul = TorchOps.silu_mul


OPS = {"torch": TorchOps, "cpu": CpuOps, "triton": TritonOps}


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
        self.gate_up = merged_linear(layer.mlp.gate_proj, layer.mlp.up_proj)
        self.down_proj = layer.mlp.down_proj
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight
        self.eps = config.rms_norm_eps

    def forward(self, x, residual, cos, sin, attn, meta, ops):
        """x: this layer's input delta; residual: the stream so far (None before layer 0)."""
        if residual is None:
            residual, h = x, ops.rms_norm(x, self.input_norm, self.eps)
        else:
            h, residual = ops.add_rms_norm(x, residual, self.input_norm, self.eps)
        t, d = h.shape[0], self.d
        qkv = self.qkv(h)
        q = qkv[:, : self.n_heads * d].view(t, self.n_heads, d)  # strided views: no copies
        k = qkv[:, self.n_heads * d: (self.n_heads + self.n_kv) * d].view(t, self.n_kv, d)
        v = qkv[:, (self.n_heads + self.n_kv) * d:].view(t, self.n_kv, d)
        ops.rotary_(q, k, cos, sin)
        x = self.o_proj(attn.forward(self.layer_idx, q, k, v, meta).reshape(t, -1))
        h, residual = ops.add_rms_norm(x, residual, self.post_norm, self.eps)
        return self.down_proj(ops.silu_mul(self.gate_up(h))), residual


class FusedCausalLM(nn.Module):
    """Drop-in for stage 01's CausalLM (same forward/compute_logits), built from one."""

    def __init__(self, model: CausalLM, ops: str = "torch", one_call_layers: bool = True):
        super().__init__()
        if ops not in OPS:
            raise ValueError(f"unknown ops {ops!r}; choose one of {sorted(OPS)}")
        self.config, self.ops = model.config, OPS[ops]
        self.one_call_layers = one_call_layers and ops == "cpu"
        self._c_weights = None  # cpu_layer.c's view of every layer's weights (False: not all its kind): made once
        self._c_head = None     # ... and of the lm_head's (None: not its kind)
        self._c_scratch = None  # cpu_layer.py's buffers, kept between steps
        self.embed_tokens, self.rotary_emb = model.model.embed_tokens, model.model.rotary_emb
        self.layers = nn.ModuleList(FusedLayer(layer, model.config) for layer in model.model.layers)
        self.final_norm, self.lm_head = model.model.norm.weight, model.lm_head

    def forward(self, input_ids, attn, meta):
        x, residual = self.embed_tokens(input_ids), None
        cos, sin = self.rotary_emb(meta.positions)
        if self._one_call(x) and LayerCalls.applies(attn, meta):
            calls = LayerCalls(self, x, cos, sin, attn, meta)
            for layer, weights in zip(self.layers, self._c_weights):
                x, residual = calls.run(layer, weights, x, residual)
        else:
            for layer in self.layers:
                x, residual = layer(x, residual, cos, sin, attn, meta, self.ops)
        return self.ops.add_rms_norm(x, residual, self.final_norm, self.config.rms_norm_eps)[0]

    def compute_logits(self, hidden):
        head = self._c_head if self._one_call(hidden) else None
        if head is not None:
            return product(hidden, *head)
        return self.lm_head(hidden).float()

    def _one_call(self, x) -> bool:
        """cpu_layer.py's path: the cpu ops, float32 activations, weights its C takes, its C
        compiled here."""
        if not self.one_call_layers or x.dtype != torch.float32:
            return False
        if self._c_weights is None:  # the first time: after the engine has split or quantized the linears
            weights = [LayerWeights.of(layer) for layer in self.layers]
            self._c_weights = cpu_layer.layer_kernel_unavailable() is None and all(weights) and weights
            self._c_head = layer_weight(self.lm_head)
        return bool(self._c_weights)

    @property
    def device(self):  # the embedding, not the lm_head: an int8 lm_head has no float weight
        return self.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.embed_tokens.weight.dtype
