"""A linear layer that keeps every CPU core busy: the weight's rows in P blocks, one `bmm`.

On our CPU build, torch's `linear` with few rows (a decode step: one row per sequence) runs its
matrix-vector product on ONE thread, whatever `torch.set_num_threads` says: the decode step's
GEMVs read the weights at ~11 GB/s of the machine's ~32. `bmm` parallelizes over its batch, so
we give it one: the [N, K] weight viewed as P blocks of N/P rows, each multiplied by the same
activations, and the P outputs laid side by side again. Same products, same sums (each output
is still one row of W times x), so only float rounding can differ from `F.linear`.

    python -m course.s06_kernels_graphs.cpu.bench_linear   # the ratio on this machine (and bf16, int8)

Measured on our 2-core CPU (fp32, one decode step's decoder matmuls of SmolLM2-135M, merged QKV
and gate-up): M=1 37.7 -> 20.8 ms, M=32 106.8 -> 63.6 ms, M=256 402.9 -> 318.4 ms. Past MANY_ROWS
rows a product is a GEMM, and goes to oneDNN where that is faster on this host (onednn.py).
"""
from __future__ import annotations

import torch
from torch import nn

from .onednn import onednn_product, takes


class SplitLinear(nn.Module):
    """Drop-in for an nn.Linear (same weight and bias, shared, not copied)."""

    def __init__(self, linear: nn.Linear, parts: int):
        super().__init__()
        n, k = linear.weight.shape
        if parts < 1 or n % parts:
            raise ValueError(f"{n} output features do not split into {parts} equal parts")
        self.weight, self.bias, self.parts = linear.weight, linear.bias, parts
        self.in_features, self.out_features = k, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and takes(x.numel() // x.shape[-1], self.weight):
            return onednn_product(x, self.weight, self.bias)   # a prefill's GEMM: onednn.py
        out = split_matmul(x, self.weight, self.parts)
        return out + self.bias if self.bias is not None else out


def split_matmul(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T as one bmm over `parts` row blocks of the weight."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(1, -1, k).expand(parts, -1, -1)                  # [P, M, K]: no copy
    blocks = weight.view(parts, -1, k).transpose(1, 2)                # [P, K, N/P]: no copy
    return torch.bmm(rows, blocks).transpose(0, 1).reshape(*lead, weight.shape[0])  # [M, N]


def split_linears(module: nn.Module, parts: int) -> nn.Module:
    """Replace, in place, every nn.Linear under `module` whose rows split into `parts`;
    returns the module. (A layer whose row count does not divide stays as it is.)"""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and child.weight.shape[0] % parts == 0:
            setattr(module, name, SplitLinear(child, parts))
        else:
            split_linears(child, parts)
    return module
