"""Model families beyond the Llama shape, each in its own module on the lesson's attention seam:

- gemma3.py: Gemma 3 (text): interleaved sliding-window and global layers, sandwich norms, GeLU;
- gpt_oss.py: gpt-oss: attention sinks, alternating sliding/full layers, YaRN RoPE, its own MoE;
- qwen3_next.py (+ delta_rule.py): Qwen3-Next: gated DeltaNet linear attention beside gated full
  attention, a fixed-size recurrent state per sequence instead of a growing K/V.

Each module has a config (a ModelConfig subclass with `from_hf`) and a model with CausalLM's
interface. The loader (weights.py) asks `family_classes` for a model_type it does not know.
"""
from __future__ import annotations

import importlib

# model_type -> (module, config class, model class)
FAMILIES = {
    "gemma3_text": ("gemma3", "Gemma3Config", "Gemma3ForCausalLM"),
    "gpt_oss": ("gpt_oss", "GptOssConfig", "GptOssForCausalLM"),
    "qwen3_next": ("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM"),
}


def family_classes(model_type: str | None) -> tuple[type, type] | None:
    """(config class, model class) of a family served here, or None (the Llama shapes, or unknown)."""
    if model_type not in FAMILIES:
        return None
    module, config_class, model_class = FAMILIES[model_type]
    loaded = importlib.import_module(f"{__name__}.{module}")
    return getattr(loaded, config_class), getattr(loaded, model_class)
