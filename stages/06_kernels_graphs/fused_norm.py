"""RMSNorm, and the residual add fused into it.

A pre-norm transformer does, twice per layer, `residual = x + residual; h = rmsnorm(residual)`.
In eager PyTorch that is an add, then pow, mean, add-eps, rsqrt, mul, cast and a mul by the
weight: ~8 launches, and the row goes to and from memory about 10 times (the add reads 2 rows
and writes 1; each of pow, the normalising mul and the weight mul reads 1 and writes 1; mean
reads 1). The fused kernel reads x and the residual once and writes the sum and the normed sum:
4 row transfers, 1 launch. One program per row; fp32 math, as stage 01's RMSNorm does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_res, stride_out, stride_res_out,
                     eps, N: tl.constexpr, BLOCK: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    xf = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.).to(tl.float32)
    if ADD_RESIDUAL:  # add in fp32, round to the input dtype: what torch's 16-bit add does
        xf = xf + tl.load(res_ptr + row * stride_res + cols, mask=ok, other=0.).to(tl.float32)
        xf = xf.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, xf, mask=ok)
        xf = xf.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)  # stage 01 casts back before the weight
    w = tl.load(w_ptr + cols, mask=ok, other=0.).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=ok)


def _launch(x, residual, weight, eps, out, res_out):
    rows, n = x.shape
    assert x.stride(1) == 1 and weight.is_contiguous()
    if rows == 0:
        return
    add = residual is not None
    _rms_norm_kernel[(rows,)](
        x, residual if add else x, weight, out, res_out if add else out,
        x.stride(0), residual.stride(0) if add else 0, out.stride(0), res_out.stride(0) if add else 0,
        float(eps), N=n, BLOCK=triton.next_power_of_2(n), ADD_RESIDUAL=add)


def rms_norm(x, weight, eps, out=None) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim of x [T, hidden]; equals stage 01's RMSNorm."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    _launch(x, None, weight, eps, out, None)
    return out


def fused_add_rms_norm(x, residual, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), both new tensors: the inputs are left untouched."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res_out = torch.empty_like(out)
    _launch(x, residual, weight, eps, out, res_out)
    return out, res_out
