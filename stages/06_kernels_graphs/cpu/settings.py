"""What only the CPU needs to be told: how its linears run, and whether layers run as one C call.

    KernelEngineConfig(..., cpu=CpuSettings(linear_splits=2, quantization="int8"))

The engine applies the first two to its fused model (`prepare`); the cpu attention backend
reads the third when it offers its one-call layers (backend.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass
class CpuSettings:
    linear_splits: int = 1            # each fused model's linear as a bmm over this many row blocks
                                      # (split_linear.py; 1 = torch's linear, which decodes on one thread)
    quantization: str | None = None   # "int8": int8 weight-only linears (int8_linear.py); None: the model's dtype
    one_call_layers: bool = True      # cpu backend: each layer of a step runs as one C call (layer.py);
                                      # False keeps the per-op path

    def __post_init__(self):
        if self.quantization not in (None, "int8"):
            raise ValueError(f"unknown quantization {self.quantization!r}; choose int8 or leave it unset")

    def changed_linears(self) -> list[str]:
        """The settings that replace the model's linears (they need the fused model's copy)."""
        return [name for name, on in (("linear_splits", self.linear_splits > 1), ("quantization", self.quantization))
                if on]

    def prepare(self, fused_model: nn.Module) -> nn.Module:
        """Int8 linears (each splitting its float path itself) or split linears, as chosen."""
        from .int8_linear import quantize_linears
        from .split_linear import split_linears

        if self.quantization == "int8":
            quantize_linears(fused_model, parts=self.linear_splits)
        elif self.linear_splits > 1:
            split_linears(fused_model, self.linear_splits)
        return fused_model
