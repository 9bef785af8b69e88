"""gpt-oss (OpenAI's open-weight MoE models), written against the Llama-family model of model.py.

What gpt-oss changes, and nothing else:

* attention sinks: each head has one learned logit [H] that joins its softmax denominator with no
  value behind it, so a head can attend to "nothing" (attention.causal_attention adds it);
* sliding windows in every other layer (`layer_types`, a window of 128 in the released models);
* biases on q, k, v and o;
* YaRN RoPE: the slow channels are interpolated by `factor`, the fast ones kept, a ramp in between,
  and cos/sin scaled by an attention factor (about 1 + 0.1 ln factor);
* every layer is MoE: a router with a bias, top-k on its logits and a softmax over those k; the
  experts' weights are stored fused and transposed (gate_up_proj [E, H, 2I], gate and up
  *interleaved* column by column, down_proj [E, I, H]), each with a bias, and their activation is a
  clamped SwiGLU: (clamp(up) + 1) * g * sigmoid(1.702 g), g = gate clamped from above.

Parameter names are transformers' GptOssForCausalLM's, so its state dict loads with strict=True.
The model is stage 01's CausalLM with these parts swapped in: same forward, same backend seam.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..config_keys import INERT as COMMON_INERT
from ..model import Attention, CausalLM, Decoder, DecoderLayer, RMSNorm
from ..rope import RotaryEmbedding, apply_rope

MODEL_TYPE = "gpt_oss"

# transformers' GptOssConfig defaults, for keys a config.json leaves out
HF_DEFAULTS = dict(num_experts_per_tok=4, sliding_window=128, rms_norm_eps=1e-5,
                   max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=True,
                   swiglu_alpha=1.702, swiglu_limit=7.0, rope_theta=150000.0)
DEFAULT_YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                    original_max_position_embeddings=4096)
READ = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
    "rope_parameters", "rope_scaling", "rope_theta", "attention_bias", "bos_token_id", "eos_token_id",
    "sliding_window", "layer_types", "num_local_experts", "num_experts", "num_experts_per_tok",
    "swiglu_alpha", "swiglu_limit", "quantization_config", "partial_rotary_factor",  # the last two: checked
})
INERT = COMMON_INERT | {
    "hidden_act",  # gpt-oss's experts use their own clamped SwiGLU; transformers never reads this key
    "experts_per_token", "initial_context_length",  # in OpenAI's config.json; transformers reads neither
}
YARN_KEYS = ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate")


def yarn_inverse_frequencies(head_dim: int, theta: float, p: dict[str, Any],
                             max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): (inv_freq [d/2], attention_factor), as transformers computes them.

    A channel that turns many times within the original context (a fast one, past beta_fast turns)
    keeps its frequency; one that turns less than beta_slow times is interpolated (divided by
    `factor`), so the longer context maps onto angles it saw in training; a linear ramp between."""
    d, orig = head_dim, p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position_embeddings / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:  # sharpens attention back: interpolated angles blur it
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def channel(turns: float) -> float:  # the (fractional) channel that turns `turns` times in `orig` positions
        return d * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = channel(p.get("beta_fast") or 32), channel(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    # transformers ramps over d/2 channel pairs with bounds counted in channels; so do we, to match
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the channel keeps its frequency; 0: it is interpolated
    pos_freqs = theta ** (torch.arange(0, d, 2).float() / d)
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
    return inv_freq, float(attention_factor)


@dataclass
class GptOssConfig(ModelConfig):
    # YaRN lives in its own field, not in ModelConfig.rope_scaling: that one feeds rope.py, which
    # knows default/linear/llama3 only, and ModelConfig refuses other types. rope_yarn is read by
    # GptOssRotaryEmbedding alone. None: plain RoPE.
    rope_yarn: dict[str, Any] | None = None
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    model_type: str = MODEL_TYPE

    @property
    def architecture(self) -> str:
        return "GptOssForCausalLM"

    @classmethod
    def from_hf(cls, hf: Any) -> "GptOssConfig":
        """From a transformers GptOssConfig or a config.json dict; a key that would change what the
        model computes in a way not implemented here is refused by name."""
        d = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        if d.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not {MODEL_TYPE!r}")
        d = {**HF_DEFAULTS, **d}
        unknown = sorted(d.keys() - READ - INERT)  # a key we cannot place might change the model: refuse it
        if unknown:
            raise ValueError(f"config keys {unknown} are not ones this gpt-oss implementation knows")
        if d.get("quantization_config"):  # e.g. OpenAI's MXFP4 experts: blocks and scales, not floats
            raise ValueError(f"config key quantization_config={d['quantization_config']!r}: quantized weights "
                             "are not implemented; convert the checkpoint to float first")
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or DEFAULT_YARN)
        theta = float(rope.pop("rope_theta", None) or d["rope_theta"])
        kind = rope.pop("rope_type", rope.pop("type", "default"))
        partial = rope.pop("partial_rotary_factor", d.get("partial_rotary_factor"))
        if partial not in (None, 1, 1.0):
            raise ValueError(f"config key partial_rotary_factor={partial!r}: RoPE on part of a head is not implemented")
        if kind not in ("default", "yarn") or (kind == "default" and rope) or set(rope) - set(YARN_KEYS):
            raise ValueError(f"config key rope_parameters={d.get('rope_parameters') or d.get('rope_scaling')!r}: "
                             "only plain RoPE and YaRN (with transformers' keys) are implemented")
        if kind == "yarn":  # transformers fills a missing pre-YaRN length so
            rope.setdefault("original_max_position_embeddings", d["max_position_embeddings"])
        n, heads = d["num_hidden_layers"], d["num_attention_heads"]
        layer_types = d.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                               for i in range(n)]  # transformers' default: even layers slide
        eos = d.get("eos_token_id")
        bias = bool(d["attention_bias"])
        experts = d.get("num_local_experts") or d.get("num_experts") or 128  # transformers' default
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, rms_norm_eps=d["rms_norm_eps"],
            rope_theta=theta, rope_scaling=None, rope_yarn=rope if kind == "yarn" else None,
            max_position_embeddings=d["max_position_embeddings"], tie_word_embeddings=bool(d["tie_word_embeddings"]),
            qkv_bias=bias, o_bias=bias, bos_token_id=d.get("bos_token_id"),
            eos_token_ids=[] if eos is None else [eos] if isinstance(eos, int) else list(eos),
            sliding_window=d["sliding_window"], layer_types=list(layer_types),
            # every layer is MoE; experts are intermediate_size wide; softmax over the top-k logits
            # is the full softmax renormalised over the chosen k (ModelConfig's norm_topk_prob)
            num_experts=experts, num_experts_per_tok=d["num_experts_per_tok"],
            moe_intermediate_size=d["intermediate_size"], norm_topk_prob=True, swiglu_alpha=float(d["swiglu_alpha"]), swiglu_limit=float(d["swiglu_limit"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' GptOssConfig accepts."""
        rope = {"rope_type": "yarn", **self.rope_yarn} if self.rope_yarn else {"rope_type": "default"}
        eos = self.eos_token_ids
        return {
            "model_type": MODEL_TYPE, "architectures": [self.architecture], "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_parameters": {**rope, "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_bias, "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
            "sliding_window": self.sliding_window,  # and layer_types in full: transformers reads none as alternating
            "layer_types": list(self.layer_types or ["full_attention"] * self.num_hidden_layers),
            "num_local_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
            "swiglu_alpha": self.swiglu_alpha, "swiglu_limit": self.swiglu_limit,
        }


class GptOssRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # as transformers' gpt-oss: the weight multiplies in float32, then the cast
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


class GptOssRotaryEmbedding(RotaryEmbedding):
    """rope.py's, with YaRN's frequencies and its attention factor on cos and sin."""

    def __init__(self, config: GptOssConfig):
        super().__init__(config)
        self.attention_factor = 1.0
        if config.rope_yarn:
            self.inv_freq, self.attention_factor = yarn_inverse_frequencies(
                config.head_dim, config.rope_theta, config.rope_yarn, config.max_position_embeddings)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = super().forward(positions)
        return cos * self.attention_factor, sin * self.attention_factor


class GptOssAttention(Attention):
    """model.py's attention (q/k/v/o, here all with biases) plus one sink logit per head."""

    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))

    def forward(self, x, cos, sin, attn, meta):
        if not attn.takes_sinks:  # leaving the sinks out would change every softmax, silently
            raise ValueError(f"gpt-oss's attention has sinks, and {type(attn).__name__} does not take them "
                             "(takes_sinks is False)")
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.n_kv_heads, self.head_dim)
        out = attn.forward(self.layer_idx, q, k, v, meta, sinks=self.sinks)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class GptOssRouter(nn.Module):
    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k], expert ids [T, k]): the k largest logits, softmaxed among themselves."""
        top, ids = torch.topk(F.linear(x, self.weight, self.bias), self.top_k, dim=-1)
        return top.softmax(dim=-1), ids


class GptOssExperts(nn.Module):
    """E experts, stored as transformers stores them: x @ W (not W @ x), gate and up interleaved."""

    def __init__(self, config: GptOssConfig):
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * i))
        self.down_proj = nn.Parameter(torch.zeros(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.zeros(e, h))
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [n, H]."""
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved: columns 0, 2, 4... gate; 1, 3, 5... up
        # both clamped (the gate from above only), so no one activation runs away; (up + 1) is OpenAI's formula
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return ((up + 1) * gate * torch.sigmoid(self.alpha * gate)) @ self.down_proj[e] + self.down_proj_bias[e]


class GptOssMLP(nn.Module):
    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.router = GptOssRouter(config)
        self.experts = GptOssExperts(config)

    def forward(self, x: torch.Tensor, attn=None) -> torch.Tensor:
        # a backend's experts_kernel (moe/) is built for the Llama-family layout (no biases, concatenated
        # gate/up, plain SiLU): it cannot run these experts, so this loop always does
        weights, ids = self.router(x)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():  # each chosen expert once, over all the rows that chose it
            rows, slot = torch.where(ids == e)
            out.index_add_(0, rows, self.experts.expert(e, x[rows]) * weights[rows, slot, None])
        return out


class GptOssDecoderLayer(DecoderLayer):
    """DecoderLayer's forward (pre-norm residual blocks) over gpt-oss's parts."""

    def __init__(self, config: GptOssConfig, layer_idx: int):
        nn.Module.__init__(self)  # DecoderLayer's own __init__ would build Llama parts
        self.input_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GptOssAttention(config, layer_idx)
        self.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GptOssMLP(config)


class GptOssModel(Decoder):
    """Decoder's forward (the backend's windows checked, cos/sin once, taps) over gpt-oss's layers."""

    def __init__(self, config: GptOssConfig):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GptOssDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = GptOssRotaryEmbedding(config)
        self.layer_windows = config.layer_windows
        self.tap_layers: tuple[int, ...] = ()
        self.tapped: torch.Tensor | None = None


class GptOssForCausalLM(CausalLM):
    """CausalLM's interface (forward -> hidden [T, h], compute_logits, taps, device, dtype) over GptOssModel."""

    def __init__(self, config: GptOssConfig):
        nn.Module.__init__(self)
        self.config = config
        self.model = GptOssModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


def tiny_config(**overrides):
    """A tiny transformers GptOssConfig for tests: the byte tokenizer's 258 ids, 4 layers alternating
    sliding (window 8) and full, 4 experts top-2, and a YaRN whose pre-extension context is 16
    positions, so prompts of a few dozen tokens already meet its interpolated channels."""
    from transformers import GptOssConfig as HFGptOssConfig

    return HFGptOssConfig(**{**dict(
        vocab_size=258, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=512, bos_token_id=256, eos_token_id=257, rms_norm_eps=1e-5,
        swiglu_limit=1.0,  # low, so the clamp bites in a small random model too
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=16)), **overrides})
