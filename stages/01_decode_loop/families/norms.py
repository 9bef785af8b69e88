"""The RMSNorm Gemma and Qwen3-Next share: x / rms(x) * (1 + weight), all in float32 and cast back
once. Its weight is stored centred on 0 (a zero weight scales by 1), and the scale multiplies
before the cast, where model.py's Llama RMSNorm casts first and scales by the weight itself."""
from __future__ import annotations

import torch
from torch import nn


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)
