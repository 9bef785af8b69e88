"""The model configuration: the handful of numbers that define a Llama-family transformer.

We read Hugging Face `config.json` files (or `PretrainedConfig` objects) into one small
dataclass, so the rest of the course never touches transformers' config classes.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config_keys import CONFIG_FAMILIES, refuse_unimplemented, with_family_defaults
from .moe.config import MoeFields, moe_fields, moe_hf_fields

SUPPORTED_MODEL_TYPES = CONFIG_FAMILIES
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}  # model_type -> the class name config.json carries
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")


def read_layer_types(d: dict[str, Any], model_type: str) -> tuple[int | None, list[str] | None]:
    """(sliding_window, layer_types) as transformers' class of the family reads them: Mistral's
    window slides in every layer; Qwen's only with use_sliding_window, in the layers layer_types
    marks (by default those from max_window_layers on). A window no sequence can leave is none."""
    n, first = d["num_hidden_layers"], d.get("max_window_layers") or 0
    window = d.get("sliding_window")
    if model_type in ("mistral", "mixtral"):
        types = ["sliding_attention"] * n if window is not None else None
    elif d.get("use_sliding_window") and window is not None:
        types = d.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    else:
        if "sliding_attention" in (d.get("layer_types") or ()):
            raise ValueError("config key layer_types marks sliding_attention layers, but use_sliding_window "
                             "is off: say which is meant")
        return None, None
    if window is None or window >= d.get("max_position_embeddings", 2048) or "sliding_attention" not in types:
        return None, None
    return window, list(types)


@dataclass
class ModelConfig(MoeFields):  # MoeFields: Mixture-of-Experts (moe/config.py)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None, or a dict like {"rope_type": "llama3", "factor": 8.0, ...} as in HF configs.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v; Llama's `attention_bias` puts them on o too
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: each head's q and k RMS-normed (own weights, [head_dim]) before RoPE
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    model_type: str = "llama"
    # Sliding-window attention (Mistral; Qwen with use_sliding_window): in a "sliding_attention"
    # layer a token attends to the last `sliding_window` positions only, itself included.
    # layer_types: one entry per layer, "full_attention" or "sliding_attention"; None: all full.
    sliding_window: int | None = None
    layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        unknown = set(self.layer_types or ()) - set(LAYER_TYPES)
        if unknown or (self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers):
            raise ValueError(f"layer_types {self.layer_types!r}: need one of {LAYER_TYPES} per layer "
                             f"({self.num_hidden_layers} layers)")
        if self.sliding_window is None and "sliding_attention" in (self.layer_types or ()):
            raise ValueError("layer_types names sliding_attention layers but sliding_window is not set")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"RoPE type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep K/V for their past: all of them here (a hybrid model's linear-attention
        layers keep a fixed-size state instead: families/qwen3_next.py)."""
        return self.num_hidden_layers

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window (None: full attention); () when every layer attends to its whole past."""
        if "sliding_attention" not in (self.layer_types or ()):
            return ()
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in self.layer_types)

    @property
    def context_limit(self) -> str:
        """What bounds a sequence, for error messages."""
        return f"{self.max_position_embeddings} tokens"

    @property
    def architecture(self) -> str:
        """The transformers class name of this family, e.g. "Qwen3ForCausalLM"."""
        return ARCHITECTURES[self.model_type]

    @classmethod
    def from_hf(cls, hf: Any) -> "ModelConfig":
        """Build from a HF config: a dict (config.json) or a transformers PretrainedConfig."""
        d = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not a Llama-family model we implement; "
                             f"supported: {SUPPORTED_MODEL_TYPES}")
        refuse_unimplemented(d)  # every key is read here, inert, or refused by name: config_keys.py
        max_len = d.get("max_position_embeddings", 2048)
        window, layer_types = read_layer_types(d, model_type)
        heads = d["num_attention_heads"]
        # transformers 5 folds rope_theta and rope_scaling into one `rope_parameters` dict.
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", None) or d.get("rope_theta") or 10000.0
        rope.setdefault("rope_type", rope.pop("type", "default"))
        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            rope_scaling=None if rope["rope_type"] == "default" else rope,
            max_position_embeddings=max_len,
            sliding_window=window,
            layer_types=layer_types,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2" or bool(d.get("qkv_bias", model_type == "qwen2_moe")),
            o_bias=attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            model_type=model_type,
            **moe_fields(d),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """A config.json; the keys it leaves out take transformers' defaults (config_keys.py)."""
        return cls.from_hf(with_family_defaults(json.loads(Path(path).read_text())))

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' class for this family (`architecture`) accepts."""
        d = {
            "model_type": self.model_type,
            "architectures": [self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,  # a copy: transformers edits it
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "mlp_bias": self.mlp_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids or None,
        }
        if self.model_type != "qwen2":
            d["attention_bias"] = self.o_bias
        if self.model_type in ("mistral", "mixtral"):  # their window slides in every layer
            d["sliding_window"] = self.sliding_window
        elif self.layer_windows:  # Qwen's: the flag, and which layers slide
            d.update(use_sliding_window=True, sliding_window=self.sliding_window, layer_types=list(self.layer_types))
        return {**d, **moe_hf_fields(self)}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

