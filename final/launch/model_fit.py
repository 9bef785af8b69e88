"""The kernel options a model's family allows, decided once the model is loaded.

Stage 06's fused layers, split and int8 linears are written for stage 01's Llama shape; a family
of its own (stage 01's families/: Gemma 3, gpt-oss, Qwen3-Next) runs its own forward, unfused.
A hybrid model's recurrent states (stage 04's hybrid/) need eager steps, one at a time (no CUDA
graphs, no overlap). What the flags left to the defaults is adjusted, and said; what a flag
asked for and the model cannot take is refused, naming the flag.
"""
from __future__ import annotations

from course.s01_decode_loop.model import CausalLM
from course.s03_paged.layer_groups import layer_groups
from course.s04_continuous_batching.hybrid.states import linear_layers


def fit_options(options: dict, args, model) -> tuple[dict, list[str]]:
    """(options the engine gets, notes for the start-up log). ValueError for a flag the model refuses."""
    options, notes = dict(options), []

    def drop(key: str, flag: str, value, why: str) -> None:
        if options.get(key) in (None, value):
            return
        if getattr(args, key, None) not in (None, value):  # asked for on the command line
            raise ValueError(f"{flag} cannot serve this {model.config.model_type} model: {why}")
        options[key] = value
        notes.append(f"{flag.split(' ')[0]} off: {why}")

    family = type(model).__name__
    if type(model) is not CausalLM:
        why = f"{family} runs its own forward (stage 06's fused layers are the Llama shape's)"
        drop("fused", "--fused", False, why)
        drop("linear_splits", "--linear-splits", 1, why)
        drop("quantization", "--quantization", None, why)
    if layer_groups(model.config.layer_windows):  # sliding layers beside full ones (stage 03's layer_groups.py)
        if options.get("cuda_graphs"):
            notes.append("layer groups off: a CUDA graph captures one block table a step, so every layer keeps "
                         "every block (with --no-cuda-graphs each group of layers keeps its own)")
        else:
            drop("fused", "--fused", False, "its sliding and full layers read their own block tables (layer groups)")
    if linear_layers(model.config):
        why = "its linear-attention layers keep a state per sequence, updated by eager steps"
        drop("cuda_graphs", "--cuda-graphs", False, why)
        drop("overlap", "--overlap", False, why)
    return options, notes


def engine_class(model, base: type) -> type:
    """`base` (final's Engine), or for a hybrid model `base` with stage 04's state cache mixed in."""
    from course.s04_continuous_batching.hybrid.engine import HybridStates

    return type(f"Hybrid{base.__name__}", (HybridStates, base), {}) if linear_layers(model.config) else base
