"""Int8 weight-only linears: a quarter of float32's bytes for the memory-bound decode step.

A decode step reads every weight once to multiply it by a handful of rows, so its time is the
bytes it reads. Stored as int8 with one scale per output row (symmetric: w ~ q * scale,
q in [-127, 127]), the weights are a quarter of float32's bytes. torch ships the CPU kernel
that multiplies bf16 activations by such weights without expanding them
(`torch._weight_int8pack_mm`, the one its own int8 weight-only path uses).

That kernel pays off only for few rows: with many (a prefill chunk), the matmul is compute-
bound and it loses to a float GEMM. So a layer picks per call: up to `max_int8_rows` rows the
int8 kernel; more rows: the weights dequantized to bfloat16 for that call, then one bf16
matmul split over the cores (split_linear.py). Activations stay float32 between layers.
With the cpu backend every step skips this module's forward: layer.c multiplies the same
int8 weights and scales itself (with VNNI's integer multiply-adds on activation rows rounded to
int16, int8.c; else widened to float32).

    python -m course.final.bench.precision   # speed and quality against float32

Quality is not free: outputs are close to, not equal to, float32's (tests/test_int8_linear.py
bounds the error; bench_precision reports greedy agreement and perplexity on held-out text).
Off unless chosen (`KernelEngineConfig(quantization="int8")`, the server's `--quantization int8`).
"""
from __future__ import annotations

import torch
from torch import nn

from .split_linear import split_matmul


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q [N, K] int8, scale [N] float32), weight ~ q * scale[:, None]."""
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """Drop-in for an nn.Linear, built from one (its float weight is not kept)."""

    def __init__(self, linear: nn.Linear, max_int8_rows: int = 8, parts: int = 1):
        super().__init__()
        q, scale = quantize_rows(linear.weight.detach().float())
        self.register_buffer("qweight", q)
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16))  # the kernel wants the activations' dtype
        self.register_buffer("scale", scale)
        self.bias = linear.bias
        self.max_int8_rows, self.parts = max_int8_rows, parts
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] <= self.max_int8_rows:
            out = torch._weight_int8pack_mm(rows, self.qweight, self.scale_bf16)
        else:  # compute-bound: a float matmul wins; expand the weights for this call only
            weight = (self.qweight.to(torch.bfloat16) * self.scale_bf16[:, None])
            parts = self.parts if self.out_features % self.parts == 0 else 1
            out = split_matmul(rows, weight, parts)
        out = out.to(x.dtype).reshape(*lead, self.out_features)
        return out + self.bias if self.bias is not None else out

    def dequantized(self) -> torch.Tensor:
        """The float32 weight these int8 values stand for."""
        return self.qweight.float() * self.scale[:, None]


def quantize_linears(module: nn.Module, max_int8_rows: int = 8, parts: int = 1) -> nn.Module:
    """Replace, in place, every nn.Linear under `module` with an Int8Linear (each splits its
    float path over `parts` itself; the engine quantizes instead of splitting, never both)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child, max_int8_rows, parts))
        else:
            quantize_linears(child, max_int8_rows, parts)
    return module
