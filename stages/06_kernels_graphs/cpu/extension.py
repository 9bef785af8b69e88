"""The CPU room's options, applied by the engine: how the fused model's linears run.

    KernelEngineConfig(..., fused=True, linear_splits=2, quantization="int8")

`linear_splits` and `quantization` replace the fused model's linears (split_linear.py,
int8_linear.py), and the same to any extra module the engine is handed (`prepare_module`). A
draft head's linears are int8 whatever `quantization` says: its outputs are guesses the target
verifies, so int8's small error costs no correctness, and a draft step, memory-bound, reads a
quarter of the bytes (SmolLM2's EAGLE-3 head: a 4-token chain drafts in ~4 ms instead of ~7 on
our 2-core CPU, the same tokens accepted per forward). The cpu attention backend reads the
third option, `one_call_layers`, itself.
"""
from __future__ import annotations

from torch import nn

from ..engine import Extension
from .int8_linear import quantize_linears
from .split_linear import split_linears


class CpuLinears(Extension):
    def __init__(self, splits: int, quantization: str | None):
        self.splits, self.quantization = splits, quantization

    @classmethod
    def of(cls, engine) -> "CpuLinears | None":
        """The engine's extension, or None where its linears stay torch's."""
        config = engine.config
        if config.quantization not in (None, "int8"):
            raise ValueError(f"unknown quantization {config.quantization!r}; choose int8 or leave it unset")
        if config.linear_splits <= 1 and config.quantization is None:
            return None
        if not config.fused:
            option = "quantization" if config.quantization else "linear_splits"
            raise ValueError(f"{option} needs fused=True: the changed layers belong to the fused copy, "
                             "never to the model you passed in")
        return cls(config.linear_splits, config.quantization)

    def prepare_module(self, module: nn.Module, draft: bool = False) -> nn.Module:
        """Int8 linears (each splitting its float path itself) or split linears, as chosen; int8
        for a draft."""
        if self.quantization == "int8" or draft:
            return quantize_linears(module, parts=self.splits)
        return split_linears(module, self.splits)
