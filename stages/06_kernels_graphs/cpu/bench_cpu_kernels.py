"""This stage's C kernels for the CPU against the PyTorch code they replace, side by side in one run.

    python -m course.s06_kernels_graphs.cpu.bench_cpu_kernels [--reps 30] [--json out.json | --results]

1. One layer's attention.
SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head dim 64), float32, block size
16, block tables shuffled over the pool. For each step shape, the same pool and metadata go to
    gather    the sync-free path of captured steps: every table gathered at once, einsums
    sdpa      the torch backend's eager plan (planned.py): decodes in length-sorted groups of 8, SDPA
    cpu       the cpu backend: attention.c reads the pool in place, every row in one call
each timing includes the KV write, as a layer's attention call does. Ratios are against `sdpa`,
the torch backend's default.

2. One layer's small ops (two add+RMSNorms, RoPE on q and k, SwiGLU's silu * up) at 1, 32 and
256 tokens: fused_model.py's TorchOps against CpuOps (ops.c).

3. One decode step's matrix products (SmolLM2-135M's 30 layers of merged QKV, o, merged
gate-up and down, and the lm_head; random weights) at 1-128 rows: layer.c's product (its
register-blocked kernel up to layer.BLOCKED_ROWS rows, where it wins, MKL's sgemm past it)
against MKL's sgemm (torch's `F.linear`) and torch's `bmm` over row blocks (split_linear.py),
and the same products with int8 weights (int8.c with VNNI), as GFLOP/s and GB/s of weights.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from course.s01_decode_loop.bench.measure import bench_cli, median_of

from ..bench.testing import make_paged_case, one_layer_step
from ..fused_model import TorchOps
from ..torch_backend import TorchPagedBackend
from .backend import CpuPagedBackend
from .int8_linear import quantize_rows
from .layer import BLOCKED_ROWS, product
from .ops import CpuOps
from .planned import PlannedTorchBackend
from .split_linear import split_matmul

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16
SHAPES = {  # name -> (query tokens, total length) per sequence
    "1 decode, 300 tokens": [(1, 300)],
    "8 decodes, 100-600": [(1, n) for n in range(100, 601, 70)],
    "32 decodes, 100-300": [(1, 100 + 6 * i) for i in range(32)],
    "32 decodes, 600-1000": [(1, 600 + 12 * i) for i in range(32)],
    "4 verifications of 5": [(5, 200 + 50 * i) for i in range(4)],
    "prefill 256 + 16 decodes": [(256, 256)] + [(1, 150 + 10 * i) for i in range(16)],
}


def measure(shape, reps: int) -> dict:
    """Every backend on its own copy of one shuffled pool (testing.py's case), the same step."""
    case = make_paged_case([t for _, t in shape], [n for n, _ in shape], num_heads=HEADS, num_kv_heads=KV_HEADS,
                           head_dim=DIM, block_size=BLOCK)
    runs = {}
    for name, make, host in (("gather", TorchPagedBackend, False), ("sdpa", PlannedTorchBackend, True),
                             ("cpu", CpuPagedBackend, True)):
        if name == "gather" and case.max_query_len > 1:
            continue  # the captured path exists for decode-only steps
        runs[name] = one_layer_step(case, make, host)
    outs = {name: b.forward(0, case.q, k, v, m) for name, (b, m, (k, v)) in runs.items()}
    err = max((outs[n] - outs["sdpa"]).abs().max().item() for n in outs)
    ms = {name: 1e3 * median_of(lambda b=b, m=m, k=k, v=v: b.forward(0, case.q, k, v, m), repeats=reps)
          for name, (b, m, (k, v)) in runs.items()}
    return {"ms": ms, "max_abs_diff": err, "cpu_speedup_vs_sdpa": ms["sdpa"] / ms["cpu"]}


def layer_ops(ops, tokens: int, hidden: int = 576, intermediate: int = 1536):
    """One layer's small ops on fresh inputs, as FusedLayer calls them."""
    g = torch.Generator().manual_seed(tokens)
    x, residual = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
    weight = torch.randn(hidden, generator=g)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, generator=g)
    q = qkv[:, :HEADS * DIM].view(tokens, HEADS, DIM)
    k = qkv[:, HEADS * DIM:(HEADS + KV_HEADS) * DIM].view(tokens, KV_HEADS, DIM)
    cos, sin = torch.randn(tokens, DIM // 2, generator=g), torch.randn(tokens, DIM // 2, generator=g)
    gate_up = torch.randn(tokens, 2 * intermediate, generator=g)

    def run():
        h, r = ops.add_rms_norm(x, residual, weight, 1e-5)
        ops.rotary_(q, k, cos, sin)
        h, r = ops.add_rms_norm(h, r, weight, 1e-5)
        return ops.silu_mul(gate_up)
    return run


def time_products(weights, rows: int, reps: int = 5) -> dict[str, float]:
    """Median seconds to multiply `rows` random rows by every weight of `weights` back to back
    ((weight, scale) pairs, as layer.layer_weight gives them): "C" is layer.c's product;
    where every weight is float32 also "MKL" (torch's F.linear, which is MKL's sgemm) and "bmm"
    (torch's split bmm). Interleaved, so a slow spell of the machine hits all of them."""
    x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w, _ in weights}
    ways = {"C": lambda w, scale: product(x[w.shape[1]], w, scale)}
    if all(scale is None for _, scale in weights):
        ways["MKL"] = lambda w, scale: F.linear(x[w.shape[1]], w)
        ways["bmm"] = lambda w, scale: split_matmul(x[w.shape[1]], w, torch.get_num_threads())
    times = {name: [] for name in ways}
    for _ in range(reps):
        for name, fn in ways.items():
            t = time.perf_counter()
            for w, scale in weights:
                fn(w, scale)
            times[name].append(time.perf_counter() - t)
    return {name: sorted(ts)[reps // 2] for name, ts in times.items()}


def step_matmuls(rows_list=(1, 2, 4, 8, 16, 32, 64, 128), reps: int = 5) -> list[dict]:
    """Every weight of one SmolLM2-135M decode step times `rows` rows: layer.c's product
    against MKL's sgemm and torch's split bmm."""
    g = torch.Generator().manual_seed(0)
    shapes = [((HEADS + 2 * KV_HEADS) * DIM, 576), (576, HEADS * DIM), (2 * 1536, 576), (576, 1536)] * 30
    weights = [(torch.randn(n, k, generator=g), None) for n, k in shapes + [(49152, 576)]]
    nbytes, flops = sum(w.numel() * 4 for w, _ in weights), sum(2 * w.numel() for w, _ in weights)
    int8 = [quantize_rows(w) for w, _ in weights]
    out = []
    for rows in rows_list:
        ms = {name: 1e3 * t for name, t in time_products(weights, rows, reps).items()}
        ms["int8"] = 1e3 * time_products(int8, rows, reps)["C"]  # the same products, int8 weights (int8.c)
        out.append({"name": f"{rows} rows", "rows": rows, "ms": ms, "C_speedup": {name: t / ms["C"] for name, t in ms.items() if name != "C"},
                    "GBps": {name: (nbytes / 4 if name == "int8" else nbytes) / t / 1e6 for name, t in ms.items()},
                    "GFLOPs": {name: rows * flops / t / 1e6 for name, t in ms.items()}})
        cells = "  ".join(f"{name} {t:6.1f} ms ({rows * flops / t / 1e6:4.0f} GFLOP/s)" for name, t in ms.items())
        print(f"{rows:4d} rows  {cells}   C {ms['MKL'] / ms['C']:4.2f}x MKL, {ms['bmm'] / ms['C']:4.2f}x bmm; "
              f"weights read at {nbytes / ms['C'] / 1e6:4.1f} GB/s (C), {nbytes / 4 / ms['int8'] / 1e6:4.1f} (int8)")
    return out


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reps", type=int, default=30)


def run(args) -> dict:
    print(f"# one layer's attention (9/3 heads, dim 64, fp32, block {BLOCK})")
    rows = []
    with torch.no_grad():
        for name, shape in SHAPES.items():
            r = measure(shape, args.reps) | {"name": name, "shape": name}
            rows.append(r)
            cells = "  ".join(f"{k} {v:7.3f} ms" for k, v in r["ms"].items())
            print(f"{name:28s} {cells}   cpu {r['cpu_speedup_vs_sdpa']:4.1f}x sdpa  (max |diff| {r['max_abs_diff']:.1e})")
        print("# one layer's small ops: 2 x add+RMSNorm, RoPE (q and k), silu * up")
        ops_rows = []
        for tokens in (1, 32, 256):
            ms = {name: 1e3 * median_of(layer_ops(ops, tokens), repeats=args.reps * 10) for name, ops in
                  (("torch", TorchOps), ("cpu", CpuOps))}
            ops_rows.append({"name": f"{tokens} tokens", "tokens": tokens, "ms": ms,
                             "cpu_speedup_vs_torch": ms["torch"] / ms["cpu"]})
            print(f"{tokens:4d} tokens  torch {ms['torch']:7.3f} ms  cpu {ms['cpu']:7.3f} ms   "
                  f"cpu {ms['torch'] / ms['cpu']:4.1f}x torch")
        print("# one decode step's matrix products (30 layers + lm_head, fp32): layer.c (its blocked kernel up "
              f"to {BLOCKED_ROWS} rows, MKL's sgemm past it) vs MKL's sgemm (F.linear) and torch's split bmm")
        matmul_rows = step_matmuls()
    return {"kernels": "cpu", "attention": rows, "small_ops": ops_rows, "step_matmuls": matmul_rows}


main = bench_cli(__doc__, add_args, run, lambda result: None, module="course.s06_kernels_graphs.cpu.bench_cpu_kernels")


if __name__ == "__main__":
    main()
