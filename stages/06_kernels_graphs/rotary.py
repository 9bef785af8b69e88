"""RoPE in place, q and k together, in one launch.

Stage 01's apply_rope, per tensor: float(), chunk into halves, four half-size multiplies by
cos/sin, a subtract and an add, cat, to(dtype), and fused_model copies the result back into the
qkv buffer: 10 launches, each writing a temporary. Per bf16 element that is ~52 bytes of
traffic (float(): read 2, write 4; the muls: 16; sub/add: 12; cat: 8; to(): 6; copy_: 4),
and it runs once for q and once for k. Here one program per token loads its cos/sin row once
and rotates every head of q and of k where they lie (strided views of the qkv matmul output):
each element is read once and written once, 4 bytes in bf16, 1 launch instead of 20. The math
is fp32, as in apply_rope, so fp32 results match it exactly (up to FMA contraction on a GPU).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, stride_h, stride_d, cos, sin,
                  HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate one token's HEADS heads (x_ptr at its head 0, channel 0) in place; returns the halves."""
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    ok = (h < HEADS) & (i < HALF)  # heads and D/2 padded to powers of two, masked back
    first = x_ptr + h * stride_h + i * stride_d  # channels 0 .. D/2-1
    second = first + HALF * stride_d  # channels D/2 .. D-1: rotate-half pairs channel i with i + D/2
    x1 = tl.load(first, mask=ok, other=0.).to(tl.float32)  # fp32 at once: 16-bit math is wrong
    x2 = tl.load(second, mask=ok, other=0.).to(tl.float32)  # in the interpreter, and lossy anyway
    r1 = (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty)
    r2 = (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty)
    tl.store(first, r1, mask=ok)
    tl.store(second, r2, mask=ok)
    return r1, r2


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr,
                   stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
                   stride_ct, stride_cd, stride_st, stride_sd,
                   Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # int64 before any multiply: t * stride can pass 2**31
    i = tl.arange(0, BLOCK_HALF)
    # One cos/sin row per token, loaded once and broadcast over every head of q and k.
    cos = tl.load(cos_ptr + t * stride_ct + i * stride_cd, mask=i < HALF, other=0.).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + t * stride_st + i * stride_sd, mask=i < HALF, other=0.).to(tl.float32)[None, :]
    _rotate_heads(q_ptr + t * stride_qt, stride_qh, stride_qd, cos, sin, Q_HEADS, HALF, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(k_ptr + t * stride_kt, stride_kh, stride_kd, cos, sin, K_HEADS, HALF, BLOCK_KH, BLOCK_HALF)


def apply_rotary_(q, k, cos, sin) -> None:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place (rotate-half layout, like stage 01's
    apply_rope) by cos/sin [T, D/2] float32. q and k may be strided views, e.g. of one fused
    qkv buffer; only their elements are written, cos and sin are only read. One launch, grid T."""
    t, q_heads, dim = q.shape
    k_heads = k.shape[1]
    assert k.shape == (t, k_heads, dim) and dim % 2 == 0
    assert cos.shape == (t, dim // 2) and sin.shape == cos.shape
    if t == 0:  # an empty grid is a launch error
        return
    _rotary_kernel[(t,)](q, k, cos, sin, *q.stride(), *k.stride(), *cos.stride(), *sin.stride(),
                         Q_HEADS=q_heads, K_HEADS=k_heads, HALF=dim // 2,
                         BLOCK_QH=triton.next_power_of_2(q_heads), BLOCK_KH=triton.next_power_of_2(k_heads),
                         BLOCK_HALF=triton.next_power_of_2(dim // 2))
