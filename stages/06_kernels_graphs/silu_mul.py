"""SwiGLU's middle, silu(gate) * up, in one launch.

The merged gate-up matmul (fused_model.py) writes [T, 2I]: gate in the first I columns, up in
the last I. Eager PyTorch then runs F.silu on the gate half and a multiply by the up half: two
launches and an [T, I] temporary written and read back (per bf16 element, silu: read 2, write
2; mul: read 4, write 2). Here one program per (row, tile of 1,024 columns) reads gate and up
once and writes the product, 6 bytes, one launch. The math is fp32 with torch's one rounding
of silu to the input's dtype before the multiply, so fp32 results match F.silu(gate) * up.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=ok, other=0.).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + N + cols, mask=ok, other=0.).to(tl.float32)
    silu = (gate / (1. + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)  # F.silu's rounding
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up) -> torch.Tensor:
    """silu(gate_up[:, :I]) * gate_up[:, I:] for gate_up [T, 2I] (rows may be strided): a new
    [T, I] tensor of gate_up's dtype. The grid is (T, I / 1,024): a shape, so graphs capture it."""
    rows, two_n = gate_up.shape
    assert two_n % 2 == 0 and gate_up.stride(1) == 1
    n = two_n // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0:  # an empty grid is a launch error
        return out
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), N=n, BLOCK=block)
    return out
