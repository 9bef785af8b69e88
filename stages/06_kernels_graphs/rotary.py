"""RoPE in place: one launch for q, one for k.

Stage 01's apply_rope splits the head into halves, multiplies and adds with cos/sin and
concatenates: ~10 elementwise ops per tensor, each writing a temporary, then a copy back into
the fused qkv buffer. Here one program per token reads its cos/sin row once and rotates every
head of q and of k where they lie (strided views of the qkv matmul output): each element is
read once and written once.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, stride_t, stride_h, stride_d, stride_cos, stride_sin,
                   HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    h = tl.arange(0, BLOCK_H)[:, None]
    ok = (h < HEADS) & (i[None, :] < HALF)
    cos = tl.load(cos_ptr + t * stride_cos + i, mask=i < HALF, other=0.)[None, :]
    sin = tl.load(sin_ptr + t * stride_sin + i, mask=i < HALF, other=0.)[None, :]
    first = x_ptr + t * stride_t + h * stride_h + i[None, :] * stride_d  # channels 0 .. D/2-1
    second = first + HALF * stride_d  # channels D/2 .. D-1: the "rotate half" pairs (i, i + D/2)
    x1 = tl.load(first, mask=ok, other=0.)
    x2 = tl.load(second, mask=ok, other=0.)
    y1 = x1.to(tl.float32) * cos - x2.to(tl.float32) * sin
    y2 = x2.to(tl.float32) * cos + x1.to(tl.float32) * sin
    tl.store(first, y1.to(x_ptr.dtype.element_ty), mask=ok)
    tl.store(second, y2.to(x_ptr.dtype.element_ty), mask=ok)


def _rotate(x, cos, sin):
    t, heads, dim = x.shape
    if t == 0:
        return
    _rotary_kernel[(t,)](x, cos, sin, x.stride(0), x.stride(1), x.stride(2), cos.stride(0), sin.stride(0),
                         HEADS=heads, HALF=dim // 2, BLOCK_H=triton.next_power_of_2(heads),
                         BLOCK_HALF=triton.next_power_of_2(dim // 2))


def apply_rotary_(q, k, cos, sin) -> None:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place by cos/sin [T, D/2] (float32)."""
    assert cos.stride(1) == 1 and sin.stride(1) == 1
    _rotate(q, cos, sin)
    _rotate(k, cos, sin)
