"""RMSNorm, and the residual add fused into it.

A pre-norm transformer does, twice per layer, `residual = x + residual; h = rmsnorm(residual)`.
Eager PyTorch (stage 01) runs that as add, float(), pow, mean, +eps, rsqrt, mul, to(dtype), mul
by the weight: 9 launches, and per bf16 element 42 bytes of traffic (add: read 4, write 2;
float(): read 2, write 4; pow: 4 + 4; mean: read 4; mul: 4 + 4; to(): read 4, write 2; weight
mul: 2 + 2). The fused kernel keeps the row in registers: it reads x and the residual once and
writes the sum and the normed sum, 8 bytes per element, one launch (rms_norm alone: 4 bytes
instead of 36). One program per row; the math is fp32, with stage 01's one rounding to x's
dtype before the weight multiply, so fp32 results match it to the last bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_res, stride_out, stride_res_out,
                     eps, N: tl.constexpr, BLOCK: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31
    cols = tl.arange(0, BLOCK)
    ok = cols < N  # hidden sizes like 576 are padded to 1024 and masked; masked lanes load 0
    xf = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.).to(tl.float32)
    if ADD_RESIDUAL:  # add in fp32, round once to x's dtype: what torch's 16-bit add does
        xf = xf + tl.load(res_ptr + row * stride_res + cols, mask=ok, other=0.).to(tl.float32)
        xf = xf.to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, xf, mask=ok)
        xf = xf.to(tl.float32)  # normalise the rounded sum, the value the next layer sees
    # The padded lanes are 0, so they add nothing to the sum of squares; divide by the true N.
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)  # stage 01 casts back before the weight
    w = tl.load(w_ptr + cols, mask=ok, other=0.).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=ok)


def _launch(x, residual, weight, eps, out, res_out):
    rows, n = x.shape
    assert x.stride(1) == 1 and out.shape == x.shape and out.stride(1) == 1 and weight.shape == (n,)
    assert weight.is_contiguous()
    if rows == 0:  # an empty grid is a launch error
        return
    add = residual is not None
    if add:
        assert residual.shape == x.shape and residual.stride(1) == 1
    _rms_norm_kernel[(rows,)](
        x, residual if add else x, weight, out, res_out if add else out,
        x.stride(0), residual.stride(0) if add else 0, out.stride(0), res_out.stride(0) if add else 0,
        float(eps), N=n, BLOCK=triton.next_power_of_2(n), ADD_RESIDUAL=add)


def rms_norm(x, weight, eps, out=None) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim of x [T, hidden] (rows may be strided); equals
    stage 01's RMSNorm for a weight in x's dtype. Writes into `out` if given (x's shape, any
    row stride), else a new tensor of x's dtype; x is only read."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    _launch(x, None, weight, eps, out, None)
    return out


def fused_add_rms_norm(x, residual, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual), the sum rounded to x's dtype.

    Out of place: both results are new tensors and x, residual are left untouched (vLLM's
    kernel instead writes the sum into `residual` and the normed sum into `x`; same bytes, but
    callers must then never reuse their inputs). Under a CUDA graph the two outputs come from
    the graph's memory pool, so allocating them costs nothing at replay."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res_out = torch.empty_like(out)
    _launch(x, residual, weight, eps, out, res_out)
    return out, res_out
