"""The KV write into an int8 pool (stage 03's quantized_kv.py): kv_write.py's scatter, quantizing
as it writes. One program per token: per KV head, the row rotated (a Walsh-Hadamard matrix, the
attention kernels' rotate_rows), scale = max |x| / 127 rounded up to a scale byte, code = x /
scale rounded half to even: `store_rows`' arithmetic exactly, so the Triton and torch paths store
the same bytes. A slot below zero is a padding row: nothing is stored.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..decode_attention import rotate_rows, rotation, scale_value


@triton.jit
def _write_int8_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, ks_ptr, vs_ptr, slot_ptr,
                          stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd, stride_st, rot_norm,
                          HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                          BLOCK_D: tl.constexpr, LOG2_ROT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t * stride_st).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    ok = (h < HEADS) & (d < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=ok, other=0.).to(tl.float32)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=ok, other=0.).to(tl.float32)
    dst = slot * (HEADS * HEAD_DIM) + h * HEAD_DIM + d  # codes: [slot, head, dim]
    heads = slot * HEADS + tl.arange(0, BLOCK_H)       # scales: [slot, head]
    h_ok = tl.arange(0, BLOCK_H) < HEADS
    k_codes, k_scale = _int8_rows(rotate_rows(k, LOG2_ROT) * rot_norm)
    v_codes, v_scale = _int8_rows(rotate_rows(v, LOG2_ROT) * rot_norm)
    tl.store(k_cache_ptr + dst, k_codes, mask=ok)
    tl.store(v_cache_ptr + dst, v_codes, mask=ok)
    tl.store(ks_ptr + heads, k_scale, mask=h_ok)
    tl.store(vs_ptr + heads, v_scale, mask=h_ok)


@triton.jit
def _int8_rows(x):
    """x [H, D] float32 (masked lanes 0) -> (int8 codes [H, D], scale bytes [H]): the smallest byte
    whose scale covers max |x| / 127, its mantissa rounded up to 4 bits in the float's own bits."""
    bits = tl.maximum(tl.max(tl.abs(x), axis=1) / 127.0, 2.0 ** -12).to(tl.int32, bitcast=True) + (1 << 19) - 1
    exponent = (bits >> 23) - 115
    byte = tl.where(exponent > 15, 255, exponent << 4 | (bits >> 19) & 15)
    scale = scale_value(byte)
    q = tl.math.div_rn(x, scale[:, None])  # exact division, as torch's
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    low = tl.floor(q)
    up = (q - low > 0.5) | ((q - low == 0.5) & ((low.to(tl.int32) & 1) == 1))  # half to even, as torch.round
    return tl.where(up, low + 1, low).to(tl.int8), byte.to(tl.uint8)


def write_int8_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    """Write k, v [T, Hkv, D] (any strides) into an int8 pool at slot_mapping [T] (< 0: skip):
    codes into k/v_cache [num_blocks, block_size, Hkv, D], scale bytes into k/v_scale
    [num_blocks, block_size, Hkv], all contiguous. Graph-capturable, as kv_write.write_kv."""
    t, heads, dim = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (t,) and k_cache.dtype == torch.int8
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (heads, dim) and k_scale.shape == k_cache.shape[:-1]
    assert all(x.is_contiguous() for x in (k_cache, v_cache, k_scale, v_scale))
    if t == 0:
        return
    _write_int8_kv_kernel[(t,)](
        k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, *k.stride(), *v.stride(), slot_mapping.stride(0),
        **rotation(dim), HEADS=heads, HEAD_DIM=dim, BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_D=triton.next_power_of_2(dim))
