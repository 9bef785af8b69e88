"""Rotary position embeddings (RoPE, Su et al. 2021).

Each pair of channels (i, i + d/2) of a query or key is rotated by an angle
position * inv_freq[i]. Attention scores then depend only on the *distance* between
positions, which is why a KV cache (stage 02) can keep keys rotated once and for all.
"""
from __future__ import annotations

import math

import torch

from .config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """inv_freq[i] = theta^(-2i/d), adjusted by the config's RoPE scaling."""
    d = config.head_dim
    # float32 throughout, as transformers does, so our angles match its angles bit for bit.
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        # Position interpolation: positions are divided by `factor`.
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_scaling(inv_freq, scaling)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: slow (long-wavelength) channels are stretched by `factor`, fast ones kept,
    and the band in between is interpolated smoothly."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, out)


class RotaryEmbedding(torch.nn.Module):
    """Computes cos/sin for arbitrary positions, so tokens of a ragged batch
    (any sequence, any position) can be rotated in one call."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(config), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # [T, d/2]
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [T, heads, d] by per-token angles cos/sin: [T, d/2] (the "rotate half" layout HF uses)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
