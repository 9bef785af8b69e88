"""A quantized K/V pool: each token's key and value rows stored as 8-bit codes plus one scale per
(token, KV head), so the pool holds ~3.9x the tokens of float32 in the same bytes and a decode step
reads ~3.9x fewer of them.

    scale = max |x| over the row's head_dim values / QMAX     (stored as float16)
    code  = round(x / scale), clamped to [-QMAX, QMAX]        (int8, or float8 e4m3)
    x    ~= code * scale

The scale comes from the row being written, so nothing is calibrated and a token's codes never
change after its write (prefix caching, preemption and rollback see the same bytes as float32
pools do). A float16 scale per 64 values costs 2 bytes: SmolLM2 holds 256/66 = 3.88x the tokens
of float32 (llama.cpp's q8_0, an fp16 scale per 32 values, 3.76x). `bfloat16` stores the values
themselves, with no scale. Attention reads the codes and scales of the keys it visits
(`QuantizedPool[index]` dequantizes just those: the reference every kernel is held to); stage 06's
C kernel does the same in registers.
"""
from __future__ import annotations

import torch

# --kv-cache-dtype's names (vLLM's): how each is stored, and the largest code a scale maps to
KV_CACHE_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8,
                   "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
SCALE_DTYPE = torch.float16


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """What the pool stores for a --kv-cache-dtype name ("auto": the model's dtype)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def bytes_per_value(dtype: torch.dtype, head_dim: int) -> float:
    """Bytes one K or V value costs in the pool, its share of the row's scale included."""
    width = torch.empty((), dtype=dtype).element_size()
    return width + (SCALE_DTYPE.itemsize / head_dim if is_quantized(dtype) else 0)


def pool_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes a token takes in a pool storing `dtype`: K and V values (or codes), and their scales."""
    values = 2 * config.num_kv_layers * config.num_key_value_heads * config.head_dim
    return round(values * bytes_per_value(dtype, config.head_dim))


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., D] -> (codes [..., D] of `dtype`, scales [...] float16): one scale per row
    (bfloat16 and float32: the values themselves, no scales)."""
    if not is_quantized(dtype):
        return x.to(dtype), None
    qmax = QMAX[dtype]
    amax = x.float().abs().amax(dim=-1)
    scales = (amax / qmax).to(SCALE_DTYPE)
    # divide by the scale as stored, so code * stored scale is what x rounds to
    safe = scales.float().clamp(min=torch.finfo(torch.float32).tiny)[..., None]
    codes = (x.float() / safe).clamp(-qmax, qmax)
    return (codes.round() if dtype == torch.int8 else codes).to(dtype), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if scales is None:
        return codes.to(dtype)
    return (codes.float() * scales.float()[..., None]).to(dtype)


class QuantizedPool:
    """One layer's K (or V) pool as codes [num_blocks, block_size, Hkv, D] and scales
    [num_blocks, block_size, Hkv] (None for bfloat16 values). Indexed like the float pool it
    replaces (`pool[blocks]`), it returns the dequantized rows, in `dtype`."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        self.codes, self.scales, self.dtype = codes, scales, dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def __getitem__(self, index) -> torch.Tensor:
        return dequantize(self.codes[index], self.scales[index] if self.scales is not None else None, self.dtype)

    def store(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """x [T, Hkv, D] into slots [T] (block * block_size + offset)."""
        codes, scales = quantize(x, self.codes.dtype)
        self.codes.view(-1, *self.codes.shape[2:])[slots] = codes
        if scales is not None:
            self.scales.view(-1, self.scales.shape[-1])[slots] = scales
