"""The fused model's small ops as C loops (ops.c), for float32 on the CPU.

Stage 01's RMSNorm is ~8 torch ops and its RoPE ~10 per tensor, each a pass over memory and a
few microseconds of dispatch; a decode step of SmolLM2-135M runs them 30 times. fused_norm.py
and rotary.py fuse them into one Triton kernel each on a GPU; on the CPU these C loops do the
same, one call each (plus SwiGLU's silu * up). `CpuOps` is the fused model's `ops` for the
cpu backend (fused_model.py); float results match `TorchOps` up to the order of a sum.

    python -m course.s06_kernels_graphs.cpu.bench_cpu_kernels   # one layer's ops, both ways
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import native

SOURCE = Path(__file__).with_name("ops.c")
FLAGS = native.BASE_FLAGS + ["-ffp-contract=off"]  # no fused multiply-adds: torch's roundings


@native.cached_loader
def _library():
    lib = native.load(SOURCE, FLAGS)
    ptr, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    for name, args in (("add_rms_norm_f32", [ptr, ptr, ptr, ptr, ptr, i64, i64, f32, i32]),
                       ("rotary_f32", [ptr, i64, i64, ptr, i64, i64, ptr, ptr, i64, i64, i32]),
                       ("silu_mul_f32", [ptr, ptr, i64, i64, i32])):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = None
    return lib


def ops_unavailable() -> str | None:
    return native.unavailable(_library)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"the CPU ops take float32 tensors on the CPU, not {x.dtype} on {x.device}")
    return x.contiguous()


def add_rms_norm(x, residual, weight, eps):
    """(RMSNorm(x + residual) * weight, x + residual); residual None: (RMSNorm(x) * weight, None)."""
    x, weight = _rows(x), _rows(weight)
    out = torch.empty_like(x)
    total = torch.empty_like(x) if residual is not None else None
    residual = _rows(residual) if residual is not None else None
    _library().add_rms_norm_f32(x.data_ptr(), residual.data_ptr() if residual is not None else None,
                                total.data_ptr() if total is not None else None, out.data_ptr(), weight.data_ptr(),
                                x.numel() // x.shape[-1], x.shape[-1], eps, torch.get_num_threads())
    return out, total


def rotary_(q, k, cos, sin):
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place; each may be a token-strided view (heads
    and channels contiguous), as the fused model's slices of its QKV output are."""
    for x in (q, k):
        if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != x.shape[2]:
            raise ValueError("rotary_ takes float32 [T, H, D] views with contiguous heads")
    cos, sin = _rows(cos), _rows(sin)
    _library().rotary_f32(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), k.shape[1],
                          cos.data_ptr(), sin.data_ptr(), q.shape[0], q.shape[2] // 2, torch.get_num_threads())


def silu_mul(gate_up):
    """silu(gate) * up for gate_up = [gate | up] along the last dim."""
    gate_up = _rows(gate_up)
    out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    _library().silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), out.numel() // out.shape[-1], out.shape[-1],
                            torch.get_num_threads())
    return out


class CpuOps:
    """fused_model.py's `ops` for the cpu backend: one C call per op."""
    add_rms_norm = staticmethod(add_rms_norm)
    rotary_ = staticmethod(rotary_)
    silu_mul = staticmethod(silu_mul)

    @staticmethod
    def rms_norm(x, weight, eps):
        return add_rms_norm(x, None, weight, eps)[0]
