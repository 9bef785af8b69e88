"""The KV write: scatter this step's keys and values into their pool slots, in one launch.

Stage 03 writes K and V with two index-put scatters, `pool.view(-1, Hkv, D)[slot_mapping] = k`.
Bytes are already minimal there (each K/V element read once, written once: 2 element transfers,
4 bytes in bf16), so this kernel saves launches, not bytes: one program per token copies its K
and V rows (Hkv x D each) to slot `slot_mapping[t]` (= block * block_size + offset), two
scatters in one launch. What PyTorch cannot do without a host sync is skip padding rows: a slot
below zero means "no slot" (vLLM's convention), and `pool[-1] = k` would silently overwrite the
last slot, while filtering with `k[slots >= 0]` is a boolean mask (value-dependent shape, no
CUDA graph). Here a negative slot is one branch in the kernel. k and v may be strided views
(slices of a fused qkv output): the kernel reads through their strides, no copy first.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd, stride_st,
                     HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # int64 before any multiply: t * stride can pass 2**31
    slot = tl.load(slot_ptr + t * stride_st).to(tl.int64)  # slot * row size too (int32 mappings)
    if slot < 0:  # a padding row: nothing to store
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    ok = (h < HEADS) & (d < HEAD_DIM)  # both dims padded to powers of two, masked back
    # A pure copy: no arithmetic, so no fp32 round trip; the bits land unchanged.
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=ok)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=ok)
    dst = slot * (HEADS * HEAD_DIM) + h * HEAD_DIM + d  # the pool is contiguous: [slot, head, dim]
    tl.store(k_cache_ptr + dst, k, mask=ok)
    tl.store(v_cache_ptr + dst, v, mask=ok)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write k, v [T, Hkv, D] (any strides) into k_cache, v_cache [num_blocks, block_size, Hkv,
    D] (contiguous, one layer) at slot_mapping [T] (int32 or int64; < 0 = skip the token).

    Writes k_cache and v_cache in place; k, v and slot_mapping are only read. The grid is T,
    a shape: no slot value is read on the host, so the launch can be captured in a CUDA graph.
    """
    t, heads, dim = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (t,)
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (heads, dim)
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    if t == 0:  # an empty grid is a launch error
        return
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        *k.stride(), *v.stride(), slot_mapping.stride(0),
        HEADS=heads, HEAD_DIM=dim, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim))
