"""Gemma 3, text only (transformers' model_type "gemma3_text"), on stage 01's attention seam.

What it changes against the Llama-family model of model.py:

- RMSNorm scales by (1 + weight), all in float32; weights are stored centred on 0.
- Sandwich norms: attention's and MLP's outputs are normed again before they join the residual.
- Every head's q and k are RMS-normed before RoPE (as in Qwen3).
- Token embeddings are multiplied by sqrt(hidden_size).
- Attention scores are scaled by query_pre_attn_scalar**-0.5 instead of head_dim**-0.5.
- Local and global layers, five to one by default: a local layer slides over a short window and
  rotates with RoPE base 10k; a global one sees everything, with base 1M (optionally scaled).
- The gated MLP uses GeLU (tanh approximation) instead of SiLU.
- Optionally, the final logits are soft-capped: cap * tanh(logits / cap).

Parameter names mirror transformers' Gemma3ForCausalLM, so its state_dict loads as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from ..config import ModelConfig
from ..config_keys import INERT as LLAMA_INERT
from ..model import CausalLM
from ..rope import RotaryEmbedding, apply_rope
from .norms import ZeroCenteredRMSNorm

MODEL_TYPE = "gemma3_text"
ACTIVATIONS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}

# keys our fields share with transformers' config: those every config carries, then the others with
# the default transformers' class gives a config.json that leaves them out
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 131_072, "tie_word_embeddings": True,
            "bos_token_id": 2, "sliding_window": 4096, "query_pre_attn_scalar": 256,
            "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None, "attn_logit_softcapping": None}
# Every key of transformers' Gemma3TextConfig is read, inert, or checked (refused by name unless
# "off"), as config_keys.py sorts the Llama family's.
READ = frozenset({*REQUIRED, *DEFAULTS, "model_type", "num_key_value_heads", "head_dim", "attention_bias",
                  "eos_token_id", "layer_types", "rope_parameters",
                  "sliding_window_pattern", "rope_theta", "rope_scaling", "rope_local_base_freq"})  # older config.json
INERT = LLAMA_INERT | {"_sliding_window_pattern"}  # what transformers derived layer_types from
CHECKED = {
    "use_bidirectional_attention": (lambda v: not v, "non-causal attention (an embedding model's)"),
    "partial_rotary_factor": (lambda v: v is None or v == 1, "RoPE on only a fraction of each head's channels"),
}


@dataclass
class Gemma3Config(ModelConfig):
    # the inherited rope_theta / rope_scaling are the global layers' RoPE; defaults are transformers'
    model_type: str = MODEL_TYPE
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    qk_norm: bool = True
    sliding_window: int | None = 4096
    rope_local_base_freq: float = 10_000.0  # RoPE base of the sliding-window (local) layers
    query_pre_attn_scalar: float = 256.0    # attention scores are scaled by its -1/2 power
    hidden_activation: str = "gelu_pytorch_tanh"
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None  # only None: see __post_init__

    def __post_init__(self) -> None:
        if self.layer_types is None:  # transformers' default: every sixth layer is global
            self.layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                for i in range(self.num_hidden_layers)]
        super().__post_init__()
        if self.attn_logit_softcapping is not None:
            # a tanh on the scores inside the softmax, behind the seam: no scaling of q can do that
            raise ValueError(f"config key attn_logit_softcapping={self.attn_logit_softcapping!r}: soft-capped "
                             "attention scores are not implemented by the attention backends")
        if self.hidden_activation not in ACTIVATIONS:
            raise ValueError(f"config key hidden_activation={self.hidden_activation!r} is not implemented; "
                             f"supported: {sorted(ACTIVATIONS)}")

    @property
    def architecture(self) -> str:
        return "Gemma3ForCausalLM"

    @property
    def embed_scale(self) -> float:
        return self.hidden_size ** 0.5

    @classmethod
    def from_hf(cls, hf: Any) -> "Gemma3Config":
        """From a gemma3_text config: a dict (config.json) or transformers' Gemma3TextConfig."""
        d = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        if d.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not {MODEL_TYPE!r}")
        full, local = _rope_parameters(d)
        for where in (d, full, local):
            for key, (accepts, needs) in CHECKED.items():
                if key in where and not accepts(where[key]):
                    raise ValueError(f"config key {key}={where[key]!r}: serving it needs {needs}, "
                                     "which this engine does not implement")
        n, heads = d["num_hidden_layers"], d["num_attention_heads"]
        every = d.get("sliding_window_pattern") or 6  # config.json files older than layer_types
        eos = d.get("eos_token_id", 1)
        return cls(
            **{k: d[k] for k in REQUIRED}, **{k: d.get(k, default) for k, default in DEFAULTS.items()},
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            qkv_bias=bool(d.get("attention_bias")), o_bias=bool(d.get("attention_bias")),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            layer_types=list(d.get("layer_types") or ["full_attention" if (i + 1) % every == 0
                                                      else "sliding_attention" for i in range(n)]),
            rope_theta=float(full.pop("rope_theta")), rope_scaling=None if full["rope_type"] == "default" else full,
            rope_local_base_freq=float(local["rope_theta"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' Gemma3TextConfig accepts."""
        full = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        eos = self.eos_token_ids
        same = (*REQUIRED, *DEFAULTS, "num_key_value_heads", "head_dim")
        return {"model_type": MODEL_TYPE, "architectures": [self.architecture], **{k: getattr(self, k) for k in same},
                "attention_bias": self.qkv_bias, "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
                "layer_types": list(self.layer_types),
                "rope_parameters": {"full_attention": full, "sliding_attention": {
                    "rope_type": "default", "rope_theta": self.rope_local_base_freq}}}


def _rope_parameters(d: dict[str, Any]) -> tuple[dict, dict]:
    """(global, local) RoPE dicts, each with rope_type and rope_theta, as transformers reads them:
    from its per-layer-type rope_parameters, or from an older config.json's rope_theta,
    rope_scaling (the global layers') and rope_local_base_freq."""
    rope = d.get("rope_parameters") or {}
    if set(rope) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"config key rope_parameters={rope!r}: Gemma 3 gives one per layer type")
    full = {**(rope.get("full_attention") or {}), **(d.get("rope_scaling") or {})}
    local = dict(rope.get("sliding_attention") or {})
    full.setdefault("rope_theta", d.get("rope_theta") or 1_000_000.0)
    local.setdefault("rope_theta", d.get("rope_local_base_freq") or 10_000.0)
    # a global layer's RoPE may be stretched linearly (Gemma 3 4B and up), a local layer's is plain
    for layer_type, p, supported in (("full_attention", full, ("default", "linear")),
                                     ("sliding_attention", local, ("default",))):
        p["rope_type"] = p.pop("type", None) or p.get("rope_type", "default")
        if p["rope_type"] not in supported:
            raise ValueError(f"config key rope_parameters[{layer_type!r}] has rope_type {p['rope_type']!r}, which "
                             f"is not implemented; supported: {supported}")
    return full, local


class Attention(nn.Module):
    def __init__(self, config: Gemma3Config, layer_idx: int):
        super().__init__()
        self.layer_idx, self.is_sliding = layer_idx, config.layer_types[layer_idx] == "sliding_attention"
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        h, d, bias = config.hidden_size, config.head_dim, config.qkv_bias  # attention_bias: on all four or none
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=bias)
        self.q_norm, self.k_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps), ZeroCenteredRMSNorm(d, config.rms_norm_eps)
        # Every backend scales scores by d**-0.5; Gemma wants query_pre_attn_scalar**-0.5. A score is
        # linear in q, so multiplying q by their ratio gives Gemma's scores through any backend, and
        # the keys a later stage caches stay as they are.
        self.q_scale = config.query_pre_attn_scalar ** -0.5 / d ** -0.5

    def forward(self, x, cos, sin, attn: AttentionBackend, meta: AttentionMetadata):
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.n_kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn.forward(self.layer_idx, q * self.q_scale, k, v, meta)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """Gated like Llama's, with GeLU in place of SiLU: down(gelu(gate(x)) * up(x))."""

    def __init__(self, config: Gemma3Config):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act = ACTIVATIONS[config.hidden_activation]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Sandwich norms: x + post_norm(attn(pre_norm(x))), then the same around the MLP. Mind the
    names: Llama's post_attention_layernorm is the MLP's input norm; Gemma's norms the attention's output."""

    def __init__(self, config: Gemma3Config, layer_idx: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm, self.post_attention_layernorm = ZeroCenteredRMSNorm(h, eps), ZeroCenteredRMSNorm(h, eps)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = ZeroCenteredRMSNorm(h, eps), ZeroCenteredRMSNorm(h, eps)

    def forward(self, x, cos, sin, attn, meta):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, attn, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Decoder(nn.Module):
    def __init__(self, config: Gemma3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_global = RotaryEmbedding(config)
        self.rotary_local = RotaryEmbedding(replace(config, rope_theta=config.rope_local_base_freq, rope_scaling=None))
        self.embed_scale = config.embed_scale
        self.layer_windows = config.layer_windows
        self.tap_layers: tuple[int, ...] = ()  # as model.Decoder's: layers an EAGLE-3 drafter reads
        self.tapped: torch.Tensor | None = None

    def forward(self, input_ids, attn, meta):
        if tuple(attn.windows) != self.layer_windows:  # a backend that ignored them would answer wrongly
            raise ValueError(f"this model's layers slide over windows {self.layer_windows or 'none'}, but "
                             f"{type(attn).__name__} was built for {tuple(attn.windows) or 'none'}")
        x = self.embed_tokens(input_ids)
        # the scale is rounded to the model's dtype first, as the reference does (in bfloat16,
        # sqrt(3072) = 55.43 becomes 55.5): the checkpoint was trained with the rounded one
        x = x * torch.tensor(self.embed_scale, dtype=x.dtype).item()
        rope = {False: self.rotary_global(meta.positions), True: self.rotary_local(meta.positions)}
        taps = []
        for i, layer in enumerate(self.layers):
            x = layer(x, *rope[layer.self_attn.is_sliding], attn, meta.for_layer(i))
            if i in self.tap_layers:
                taps.append(x)
        self.tapped = torch.cat(taps, dim=-1) if taps else None
        return self.norm(x)


class Gemma3ForCausalLM(CausalLM):
    """CausalLM's interface (forward, compute_logits, taps, device, dtype) around Gemma's decoder."""

    def __init__(self, config: Gemma3Config):
        nn.Module.__init__(self)  # not CausalLM.__init__, which would build a Llama decoder
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if (cap := self.config.final_logit_softcapping) is not None:
            logits = torch.tanh(logits / cap) * cap  # squashed smoothly into (-cap, cap)
        return logits.float()


def tiny_config(**overrides):
    """A tiny transformers Gemma3TextConfig for tests: testing.byte_tokenizer()'s vocabulary, six
    layers (five sliding over 8 positions, then a global one), and head_dim, hidden / heads and
    query_pre_attn_scalar all different, so a mix-up shows."""
    from transformers import Gemma3TextConfig

    base = dict(vocab_size=258, hidden_size=48, intermediate_size=96, num_hidden_layers=6, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
                max_position_embeddings=512, bos_token_id=256, eos_token_id=257, pad_token_id=0,
                initializer_range=0.1,  # wider than real checkpoints' 0.02, so random logits spread
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}})
    return Gemma3TextConfig(**{**base, **overrides})
