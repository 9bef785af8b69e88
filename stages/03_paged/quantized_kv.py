"""A quantized K/V pool: each token's key and value rows stored as 8-bit codes plus a one-byte
scale per (token, KV head), so the pool holds 3.94x the tokens of float32 in the same bytes (at
head_dim 64) and a decode step reads 3.94x fewer of them.

    r     = rotate(x)                                   (a Walsh-Hadamard rotation, below)
    scale = max |r| over the row's head_dim values / QMAX, rounded *up* to a scale byte
    code  = round(r / scale), in [-QMAX, QMAX]          (int8, or float8 e4m3)
    x    ~= rotate(code * scale)

The rotation. A key row has a few large channels (RoPE pairs that carry position) beside many
small ones; one scale per row is set by the large ones, so the small ones get few steps. An
orthonormal Walsh-Hadamard matrix H (entries +-1/sqrt(n), H H = I) mixes every channel into every
other, so the rotated row's values are alike in size and the same 8 bits hold it finer (QuaRot,
Ashkboos et al. 2024, rotates activations and KV this way). Attention never needs the
row back: q . k = (Hq) . (Hk), and sum_t p_t (H v_t) = H (sum_t p_t v_t), so a kernel rotates
the query going in and the output coming out, and reads the codes as they lie (what it buys in
next-token agreement: final/bench/kv_cache.py, its "rows not rotated" row).

The scale byte: 4 exponent bits and 4 mantissa bits, 2^(e - 12) * (1 + m / 16), from 2^-12 to
15.5 in steps of at most 1/16; decoding it is two shifts into a float32's fields, the same bits in
torch, C and Triton. It is rounded up, so no code is clipped (but in a row whose largest rotated
value passes 15.5 * QMAX: SmolLM2's largest is ~14).

The scale comes from the row being written, so nothing is calibrated and a token's codes never
change after its write (prefix caching, preemption and rollback see the same bytes as float32
pools do). `bfloat16` stores the values themselves, unrotated, with no scale. Attention reads the
codes and scales of the keys it visits (`QuantizedPool[index]` dequantizes and rotates back just
those: the reference every kernel is held to); stage 06's C and Triton kernels do it in registers.
"""
from __future__ import annotations

import torch

# --kv-cache-dtype's names (vLLM's): how each is stored, and the largest code a scale maps to
KV_CACHE_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8,
                   "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
SCALE_DTYPE = torch.uint8  # a scale byte: 4 exponent bits, 4 mantissa bits (scale_value)
SCALE_EXPONENT_BIAS = 12   # byte 0 is 2^-12; byte 0xFF is 2^3 * 31/16 = 15.5


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


def scale_value(byte: torch.Tensor) -> torch.Tensor:
    """A scale byte (e << 4 | m) as the float32 2^(e - 12) * (1 + m/16): e and m moved into a
    float32's exponent and top mantissa bits."""
    b = byte.to(torch.int32)
    return (((b >> 4) + (127 - SCALE_EXPONENT_BIAS)) << 23 | (b & 15) << 19).view(torch.float32)


def scale_byte(ratio: torch.Tensor) -> torch.Tensor:
    """The smallest scale byte whose value is >= ratio (float32, >= 0): the mantissa rounded up to
    4 bits in the float's own bits (a carry moves into the exponent), then clamped to the range."""
    bits = ratio.float().clamp(min=2.0 ** -SCALE_EXPONENT_BIAS).view(torch.int32) + (1 << 19) - 1
    exponent = (bits >> 23) - (127 - SCALE_EXPONENT_BIAS)
    byte = torch.where(exponent > 15, 255, exponent << 4 | (bits >> 19) & 15)
    return byte.to(SCALE_DTYPE)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] times the orthonormal Walsh-Hadamard matrix, block-diagonal in blocks of the
    largest power of two dividing D (all of D at 64 or 128). Its own inverse. The butterflies in
    C's order (attention.c's rotate_row), so both give the same bits."""
    dim = x.shape[-1]
    block, y, h = dim & -dim, x.float(), 1
    while h < block:  # pairs (j, j + h) within runs of 2h: (a + b, a - b)
        y = y.unflatten(-1, (dim // (2 * h), 2, h))
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2).flatten(-3)
        h *= 2
    return y * block ** -0.5  # the scalar in float32, as C's and Triton's


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., D] -> (codes [..., D] of `dtype`, scale bytes [...]): one scale per row, the rows
    as they are (the pool rotates first; bfloat16 and float32: the values themselves, no scales)."""
    if not is_quantized(dtype):
        return x.to(dtype), None
    qmax = QMAX[dtype]
    scales = scale_byte(x.float().abs().amax(dim=-1) / qmax)
    # divide by the scale as stored, so code * stored scale is what x rounds to
    codes = (x.float() / scale_value(scales)[..., None]).clamp(-qmax, qmax)
    return (codes.round() if dtype == torch.int8 else codes).to(dtype), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if scales is None:
        return codes.to(dtype)
    return (codes.float() * scale_value(scales)[..., None]).to(dtype)


def store_rows(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a pool of `dtype` keeps for rows x [..., D]: rotated, then quantized (codes, scales);
    bfloat16 and float32: the values, unrotated."""
    return quantize(rotate(x) if is_quantized(dtype) else x, dtype)


def load_rows(codes: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """store_rows' rows back, as `dtype`."""
    return dequantize(codes, None, dtype) if scales is None else rotate(dequantize(codes, scales)).to(dtype)


class QuantizedPool:
    """One layer's K (or V) pool as codes [num_blocks, block_size, Hkv, D] and scales
    [num_blocks, block_size, Hkv] (None for bfloat16 values). Indexed like the float pool it
    replaces (`pool[blocks]`), it returns the rows back (dequantized, rotated back), in `dtype`."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        self.codes, self.scales, self.dtype = codes, scales, dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def __getitem__(self, index) -> torch.Tensor:
        return load_rows(self.codes[index], None if self.scales is None else self.scales[index], self.dtype)

    def store(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """x [T, Hkv, D] into slots [T] (block * block_size + offset)."""
        codes, scales = store_rows(x, self.codes.dtype)
        self.codes.view(-1, *self.codes.shape[2:])[slots] = codes
        if scales is not None:
            self.scales.view(-1, self.scales.shape[-1])[slots] = scales
