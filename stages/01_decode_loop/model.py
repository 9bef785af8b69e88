"""A Llama-family transformer from scratch (Llama, SmolLM2, Qwen2-style GQA, Qwen3's q/k norm,
Mixture-of-Experts layers: Mixtral, Qwen2-MoE, Qwen3-MoE).

Module and parameter names mirror Hugging Face's LlamaForCausalLM, so its checkpoints load
with a plain `load_state_dict`. The model works on a *flat* batch: input_ids is [T], the
tokens of all sequences one after another; `AttentionMetadata` says where each sequence
starts. Attention itself is delegated to a backend (attention.py), the seam every later
stage plugs into.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionBackend, AttentionMetadata
from .config import ModelConfig
from .moe.experts import SparseMoeBlock
from .rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 for stability (as the reference does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        h, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=config.o_bias)
        # Qwen3: an RMSNorm over each head's d channels of q and of k, before RoPE: a query's and
        # a key's sizes are then set by learned weights, so attention logits cannot run away.
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x, cos, sin, attn: AttentionBackend, meta: AttentionMetadata):
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.v_proj(x).view(t, self.n_kv_heads, self.head_dim)
        out = attn.forward(self.layer_idx, q, k, v, meta)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x, attn=None):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # a Mixture-of-Experts layer (moe/) where the config says so: same input, same output shape
        self.mlp = SparseMoeBlock(config) if config.is_moe_layer(layer_idx) else MLP(config)

    def forward(self, x, cos, sin, attn, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn, meta)
        return x + self.mlp(self.post_attention_layernorm(x), attn)  # an MoE layer asks attn for its kernel


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.layer_windows = config.layer_windows
        # layers whose outputs a drafter also reads (EAGLE-3, stage 05): after each forward,
        # `tapped` holds them side by side, [rows, len(tap_layers) * hidden]
        self.tap_layers: tuple[int, ...] = ()
        self.tapped: torch.Tensor | None = None

    def forward(self, input_ids, attn, meta):
        if tuple(attn.windows) != self.layer_windows:  # a backend that ignored them would answer wrongly
            raise ValueError(f"this model's layers slide over windows {self.layer_windows or 'none'}, but "
                             f"{type(attn).__name__} was built for {tuple(attn.windows) or 'none'}")
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(meta.positions)  # computed once, shared by all layers
        taps = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attn, meta.for_layer(i))
            if i in self.tap_layers:
                taps.append(x)
        self.tapped = torch.cat(taps, dim=-1) if taps else None
        return self.norm(x)


class CausalLM(nn.Module):
    """Decoder + lm_head. `forward` returns final hidden states for every row;
    `compute_logits` turns only the rows we need into vocabulary logits (the lm_head is
    the biggest matmul of a small model, so we never run it on rows we will not sample)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, attn: AttentionBackend,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, attn, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @property
    def tap_layers(self) -> tuple[int, ...]:  # see Decoder: the layers an EAGLE-3 drafter reads
        return self.model.tap_layers

    @tap_layers.setter
    def tap_layers(self, layers: tuple[int, ...]) -> None:
        self.model.tap_layers = tuple(layers)

    @property
    def tapped(self) -> torch.Tensor | None:
        return self.model.tapped

    @tapped.setter
    def tapped(self, rows: torch.Tensor | None) -> None:  # a replayed graph hands back its taps
        self.model.tapped = rows

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype


def init_random_weights(model: CausalLM, seed: int) -> CausalLM:
    """Seeded random weights for tests: small normal matrices, norms near 1 (not exactly 1,
    so a test notices if a norm weight is ignored), biases small."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g) * (5.0 if "embed" in name else 1.0))
    return model
