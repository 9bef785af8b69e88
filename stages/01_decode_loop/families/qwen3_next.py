"""Qwen3-Next, written against the Llama-family model of model.py.

What Qwen3-Next changes:

* most layers mix tokens with linear attention, not softmax attention: a Gated DeltaNet
  (delta_rule.py) whose memory is a fixed-size state per head, not a growing KV cache. By
  default three layers in four; every fourth is full attention (`mixer_types`);
* the full-attention layers are gated: q_proj also yields a gate per head and channel, and each
  head's output is multiplied by sigmoid(gate) before o_proj. They keep Qwen3's q/k norm;
* partial RoPE: only the first `partial_rotary_factor` (a quarter) of each head's channels are
  rotated, the rest carry no position;
* zero-centred RMSNorms: the weight is stored as an offset from 1, x / rms(x) * (1 + weight);
* every MoE layer also has Qwen2-MoE's shared expert, gated by sigmoid(x . w) (moe/experts.py).

Parameter names are transformers' Qwen3NextForCausalLM's, so its state dict loads with
strict=True. Full-attention layers go through the backend seam (attention.py) like any layer of
model.py; a DeltaNet layer runs the rule itself, over each whole sequence of the flat batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SUPPORTED_ROPE_TYPES, ModelConfig
from ..config_keys import INERT as COMMON_INERT
from ..model import MLP, CausalLM, Decoder, RMSNorm
from ..moe.config import moe_fields
from ..moe.experts import SparseMoeBlock
from ..rope import RotaryEmbedding, apply_rope
from .delta_rule import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule
from .norms import ZeroCenteredRMSNorm

MODEL_TYPE = "qwen3_next"
LINEAR, FULL = "linear_attention", "full_attention"

# transformers' Qwen3NextConfig defaults, for keys a config.json leaves out
HF_DEFAULTS = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48, num_attention_heads=16,
    num_key_value_heads=2, head_dim=256, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1,
    moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
    norm_topk_prob=True, mlp_only_layers=[], rope_theta=10000.0, partial_rotary_factor=0.25,
    full_attention_interval=4, bos_token_id=None, eos_token_id=None)
# keys that mean the same here and in transformers' config, copied as they are
SAME = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
        "bos_token_id", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim")
MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
       "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")  # moe/config.py reads them
READ = frozenset(HF_DEFAULTS) | {"model_type", "rope_parameters", "rope_scaling", "layer_types"}
INERT = COMMON_INERT | {
    "use_sliding_window", "sliding_window", "max_window_layers",  # transformers' Qwen3-Next reads none of them
    "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",  # the multi-token-prediction head, not loaded
}


@dataclass
class Qwen3NextConfig(ModelConfig):
    # Which token mixer each layer runs: LINEAR (Gated DeltaNet) or FULL (gated softmax attention).
    # transformers calls this `layer_types`, but ModelConfig.layer_types says which layers of the
    # KV backend slide (full or sliding): here none slides, so that one stays None.
    mixer_types: list[str] = field(default_factory=list)
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32  # a multiple of the key heads: each q/k head serves several v heads
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True
    model_type: str = MODEL_TYPE

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.mixer_types) != self.num_hidden_layers or set(self.mixer_types) - {LINEAR, FULL}:
            raise ValueError(f"mixer_types {self.mixer_types!r}: need {LINEAR!r} or {FULL!r} for each of "
                             f"{self.num_hidden_layers} layers")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives {self.rotary_dim} "
                             f"rotated channels of {self.head_dim}: need an even number, at least 2")

    @property
    def architecture(self) -> str:
        return "Qwen3NextForCausalLM"

    @property
    def num_kv_layers(self) -> int:
        """Only the full-attention layers keep K/V; a linear layer's state lives beside the pool."""
        return self.mixer_types.count(FULL)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)  # rounded down, as transformers does

    @classmethod
    def from_hf(cls, hf: Any) -> "Qwen3NextConfig":
        """From a transformers Qwen3NextConfig or a config.json dict; a key whose value would make
        the model compute something not implemented here is refused by name."""
        d = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        if d.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not {MODEL_TYPE!r}")
        d = {**HF_DEFAULTS, **d}
        unknown = sorted(d.keys() - READ - INERT)  # a key we cannot place might change the model: refuse it
        if unknown:
            raise ValueError(f"config keys {unknown} are not ones this Qwen3-Next implementation knows")
        if d["hidden_act"] not in ("silu", "swish"):
            raise ValueError(f"config key hidden_act={d['hidden_act']!r}: only SiLU gates are implemented")
        mixers = d.get("layer_types") or [FULL if (i + 1) % d["full_attention_interval"] == 0 else LINEAR
                                          for i in range(d["num_hidden_layers"])]  # transformers' default
        if set(mixers) - {LINEAR, FULL}:
            raise ValueError(f"config key layer_types={mixers!r}: only {LINEAR!r} and {FULL!r} are implemented")
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})  # transformers 5 folds in the next two
        theta = rope.pop("rope_theta", None) or d["rope_theta"]
        partial = rope.pop("partial_rotary_factor", None) or d["partial_rotary_factor"]
        rope.setdefault("rope_type", rope.pop("type", "default"))
        if rope["rope_type"] not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"config key rope_parameters: rope_type {rope['rope_type']!r} is not implemented; "
                             f"supported: {SUPPORTED_ROPE_TYPES}")
        eos = d.get("eos_token_id")
        return cls(**{k: d[k] for k in SAME}, **moe_fields(d), mixer_types=list(mixers), rope_theta=float(theta),
                   rope_scaling=None if rope["rope_type"] == "default" else rope, partial_rotary_factor=float(partial),
                   qkv_bias=bool(d["attention_bias"]), o_bias=bool(d["attention_bias"]),  # on q, k, v and o
                   eos_token_ids=[] if eos is None else [eos] if isinstance(eos, int) else list(eos))

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' Qwen3NextConfig accepts."""
        eos = self.eos_token_ids
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor}
        return {"model_type": MODEL_TYPE, "architectures": [self.architecture], "hidden_act": "silu",
                **{k: getattr(self, k) for k in SAME + MOE}, "layer_types": list(self.mixer_types),
                "rope_parameters": rope, "attention_bias": self.o_bias,
                "eos_token_id": eos[0] if len(eos) == 1 else eos or None}


class GatedRMSNorm(RMSNorm):
    """The DeltaNet's output norm: model.py's RMSNorm over each value head's output (its weight
    from 1), then multiplied by silu(z), a gate computed from the layer's input."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (super().forward(x) * F.silu(gate.float())).to(x.dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] channels of each head; the rest pass through unrotated."""
    rot = 2 * cos.shape[-1]
    return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)


class GatedAttention(nn.Module):
    """Softmax attention through the backend, with q/k norm, partial RoPE and an output gate."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int):
        super().__init__()
        # the pool keeps K/V for the attention layers only, numbered among themselves
        self.kv_layer = config.mixer_types[:layer_idx].count(FULL)
        h, d, self.n_heads, self.n_kv_heads = (config.hidden_size, config.head_dim, config.num_attention_heads,
                                               config.num_key_value_heads)
        self.q_proj = nn.Linear(h, self.n_heads * d * 2, bias=config.qkv_bias)  # per head: d query, d gate
        self.k_proj = nn.Linear(h, self.n_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=config.o_bias)
        self.q_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps)

    def forward(self, x, cos, sin, attn, meta):
        t = x.shape[0]
        q, gate = self.q_proj(x).view(t, self.n_heads, -1).chunk(2, dim=-1)
        k = self.k_norm(self.k_proj(x).view(t, self.n_kv_heads, -1))
        q, k = apply_partial_rope(self.q_norm(q), cos, sin), apply_partial_rope(k, cos, sin)
        v = self.v_proj(x).view(t, self.n_kv_heads, -1)
        out = attn.forward(self.kv_layer, q, k, v, meta) * torch.sigmoid(gate)  # a head can mute its output
        return self.o_proj(out.reshape(t, -1))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """Linear attention: projections, a short causal conv, the gated delta rule, a gated norm."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int):
        super().__init__()
        c, self.layer_idx = config, layer_idx
        self.nk, self.nv, self.dk, self.dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                                              c.linear_key_head_dim, c.linear_value_head_dim)
        self.per_k = self.nv // self.nk  # value heads per key head
        conv_dim = 2 * self.nk * self.dk + self.nv * self.dv  # the conv runs over q, k and v channels
        # holds the kernel [C, 1, K] (transformers' name and shape); delta_rule.causal_conv1d applies it
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, c.linear_conv_kernel_dim, groups=conv_dim, bias=False,
                                padding=c.linear_conv_kernel_dim - 1)
        self.in_proj_qkvz = nn.Linear(c.hidden_size, 2 * self.nk * self.dk + 2 * self.nv * self.dv, bias=False)
        self.in_proj_ba = nn.Linear(c.hidden_size, 2 * self.nv, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.nv * self.dv, c.hidden_size, bias=False)

    def forward(self, x, attn, meta):
        states = attn.recurrent  # None: whole sequences from an empty state (stage 01)
        if states is None and not torch.equal(meta.query_lens, meta.seq_lens):
            raise ValueError("a linear-attention layer needs whole sequences here, or a backend that keeps "
                             "its states (stage 04's hybrid/)")
        t, nk, nv, dk, dv = x.shape[0], self.nk, self.nv, self.dk, self.dv
        # the projections' outputs come grouped by key head: its q, its k, then v and z of its value heads
        q, k, v, z = self.in_proj_qkvz(x).view(t, nk, -1).split([dk, dk, self.per_k * dv, self.per_k * dv], -1)
        b, a = self.in_proj_ba(x).view(t, nk, -1).split([self.per_k, self.per_k], -1)
        beta = b.reshape(t, nv).sigmoid()  # how hard each token writes, in (0, 1)
        # log-decay g = -A * softplus(a + dt_bias) <= 0: a rate A = exp(A_log) per head times a step size
        # per token, > 0 (as Mamba discretises its state's decay)
        g = -self.A_log.float().exp() * F.softplus(a.reshape(t, nv).float() + self.dt_bias)
        qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        out = torch.empty(t, nv, dv, dtype=x.dtype, device=x.device)
        bounds = meta.cu_seqlens_q.tolist()
        for seq, (first, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            # the state before this step's rows (None: empty), then the rows in runs that end where
            # the cache wants the state kept (block boundaries, for prefix caching; and the end)
            conv_state, state = states.load(self.layer_idx, seq) if states else (None, None)
            cuts = states.cuts(seq) if states else [end - first]
            for s, e in zip([first] + [first + c for c in cuts[:-1]], [first + c for c in cuts]):
                mixed, conv_state = causal_conv1d(qkv[s:e], self.conv1d.weight[:, 0], conv_state)
                qs, ks, vs = F.silu(mixed).split([nk * dk, nk * dk, nv * dv], dim=-1)
                # unit-length keys keep each write bounded; queries scaled like softmax attention's
                qs = l2norm(qs.float().reshape(e - s, nk, dk)) * dk ** -0.5
                ks = l2norm(ks.float().reshape(e - s, nk, dk))
                qs, ks = qs.repeat_interleave(self.per_k, 1), ks.repeat_interleave(self.per_k, 1)
                rule = recurrent_gated_delta_rule if e - s == 1 else chunk_gated_delta_rule  # decode: one step
                out[s:e], state = rule(qs, ks, vs.reshape(e - s, nv, dv), g[s:e], beta[s:e], initial_state=state)
                if states:
                    states.save(self.layer_idx, seq, e - first, (conv_state, state))
        out = self.norm(out, z.reshape(t, nv, dv))
        return self.out_proj(out.reshape(t, nv * dv))


class Qwen3NextDecoderLayer(nn.Module):
    """Pre-norm residual blocks: x + mixer(norm(x)), then x + mlp(norm(x)); the mixer is a
    Gated DeltaNet (`linear_attn`) or gated attention (`self_attn`), as the config says."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int):
        super().__init__()
        self.is_linear = config.mixer_types[layer_idx] == LINEAR
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = GatedAttention(config, layer_idx)
        self.mlp = SparseMoeBlock(config) if config.is_moe_layer(layer_idx) else MLP(config)
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, attn, meta):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, attn, meta) if self.is_linear else self.self_attn(h, cos, sin, attn, meta))
        return x + self.mlp(self.post_attention_layernorm(x), attn)


class Qwen3NextModel(Decoder):
    """Decoder's forward (backend windows checked: none here, cos/sin once, taps) over these layers."""

    def __init__(self, config: Qwen3NextConfig):
        nn.Module.__init__(self)  # Decoder's own __init__ would build Llama layers
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3NextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        # frequencies for the rotated channels only: those of a head rotary_dim wide
        self.rotary_emb = RotaryEmbedding(replace(config, head_dim=config.rotary_dim, partial_rotary_factor=1.0))
        self.layer_windows = config.layer_windows  # (): no layer slides
        self.tap_layers: tuple[int, ...] = ()
        self.tapped: torch.Tensor | None = None


class Qwen3NextForCausalLM(CausalLM):
    """CausalLM's interface (forward -> hidden [T, h], compute_logits, taps, device, dtype) over Qwen3NextModel."""

    def __init__(self, config: Qwen3NextConfig):
        nn.Module.__init__(self)
        self.config = config
        self.model = Qwen3NextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


def tiny_config(**overrides):
    """A tiny transformers Qwen3NextConfig for tests: the byte tokenizer's 258 ids, 4 layers (3
    DeltaNet, then 1 full attention), head dims 16, 2 key heads serving 4 value heads, 4 experts top-2."""
    from transformers import Qwen3NextConfig as HFQwen3NextConfig

    return HFQwen3NextConfig(**{**dict(
        vocab_size=258, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=24, max_position_embeddings=512,
        bos_token_id=256, eos_token_id=257), **overrides})
