"""The KV write: scatter this step's keys and values into their pool slots, one launch.

Stage 03 writes K and V with two index-put scatters (`pool.view(-1, Hkv, D)[slot_mapping] = k`),
each a launch plus the index bookkeeping. Here one program per token copies its K and V rows
(Hkv x D each) to slot `slot_mapping[t]` (= block * block_size + offset). A slot below zero is
skipped, vLLM's convention for padding rows. Bytes moved are the minimum: each K/V element is read
once and written once. k and v may be strided views (slices of a fused qkv output).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd, stride_slot,
                     HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: slot * row size can pass 2**31
    if slot < 0:  # a padding row: nothing to store
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    ok = (h < HEADS) & (d < HEAD_DIM)  # both padded to powers of two
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=ok)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=ok)
    dst = slot * stride_slot + h * HEAD_DIM + d  # the pool is contiguous: [slot, head, dim]
    tl.store(k_cache_ptr + dst, k, mask=ok)
    tl.store(v_cache_ptr + dst, v, mask=ok)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """k, v: [T, Hkv, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] contiguous (one
    layer); slot_mapping: [T] ints. Writes k_cache/v_cache in place."""
    t, heads, dim = k.shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[2:] == (heads, dim)
    if t == 0:
        return
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), heads * dim,
        HEADS=heads, HEAD_DIM=dim, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim))
