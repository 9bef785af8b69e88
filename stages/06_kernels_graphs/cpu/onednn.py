"""Products of many rows through oneDNN instead of MKL's sgemm, where that is faster here.

A prefill chunk's products (hundreds of rows) are bounded by arithmetic, and the GEMM that does
them decides the prefill's speed. torch's float32 `linear` calls MKL's sgemm; torch also ships
oneDNN, whose matmul (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's CPU backend
uses) runs its own JIT kernels. Which is faster depends on the host: on our 2-core AMD EPYC
(AVX-512) oneDNN's float32 product of [512, 576] x [576, 960] runs 2.1x MKL's (453 against 214
GFLOP/s); MKL is Intel's and tuned for Intel cores. So the engine does not guess: the first
time a weight shape meets many rows, both are timed on it (a few milliseconds, once per shape
and process) and the faster one serves that shape from then on.

    COURSE_MANY_ROWS_PRODUCT=mkl|onednn    # force one (benchmarks compare them side by side)

Both are float32 products; they differ only in the order of each sum's additions.
`python -m course.s06_kernels_graphs.cpu.bench_linear --rows 1 32 256` prints the ratio on this machine.
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

CHOICES = ("mkl", "onednn")
MANY_ROWS = 64  # past this many rows a product is a GEMM (layer.c's blocked kernel wins below: layer.py)
_chosen: dict[tuple[int, int], str] = {}


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k] @ weight[n, k].T (+ bias) by oneDNN's matmul, float32."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def choice(weight: torch.Tensor) -> str:
    """"mkl" or "onednn" for products of many rows by this weight: forced by the environment,
    else the faster on this host for its shape, timed once."""
    forced = os.environ.get("COURSE_MANY_ROWS_PRODUCT")
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"COURSE_MANY_ROWS_PRODUCT={forced!r}: choose one of {', '.join(CHOICES)}")
        return forced if forced == "mkl" or onednn_available() else "mkl"
    shape = tuple(weight.shape)
    if shape not in _chosen:
        _chosen[shape] = _faster(weight) if onednn_available() else "mkl"
    return _chosen[shape]


def takes(rows: int, weight: torch.Tensor) -> bool:
    """Does a product of `rows` rows by this weight go to oneDNN: a GEMM (past MANY_ROWS rows),
    for a shape oneDNN does faster on this host?"""
    return rows > MANY_ROWS and choice(weight) == "onednn"


def _faster(weight: torch.Tensor, rows: int = 256, reps: int = 3) -> str:
    x = torch.randn(rows, weight.shape[1])
    best = {}
    for name, fn in (("mkl", F.linear), ("onednn", onednn_product)):
        fn(x, weight)  # warm: oneDNN compiles its kernel for the shape on first use
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(x, weight)
            times.append(time.perf_counter() - start)
        best[name] = min(times)
    return min(best, key=best.get)
