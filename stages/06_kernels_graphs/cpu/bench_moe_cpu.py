"""An MoE layer's experts on the CPU: what the cpu backend's grouped path costs against the
products its routed experts alone need.

    python -m course.s06_kernels_graphs.cpu.bench_moe_cpu [--experts 16] [--batches 1 4 16 64] [--results]

Float32, Qwen3-30B-A3B's expert shape (hidden 2,048, experts 768 wide, top-8) with `--experts`
of them (its 128 would be 2.4 GB a layer in float32). For each batch, random routings:

    products  for every expert the step chose, its two products (gate-up, down) on its rows,
              rows gathered beforehand: layer.c's products, nothing else (the floor)
    grouped   the cpu backend's `experts_kernel`: routing's sort, the gather, the same products,
              silu * up, the weighting and the index_add back to the tokens

`overhead` is grouped over products: what the MoE bookkeeping adds to the bytes that must be
read. The two run alternately, median of `--reps`.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli, median_of
from course.s01_decode_loop.moe.experts import Experts
from course.s01_decode_loop.moe.router import route
from course.s01_decode_loop.testing import TINY_CONFIGS
from course.s03_paged.paged_attention import PagedKVCache

from .backend import CpuPagedBackend
from .layer import product


def products_only(experts: Experts, rows_of: dict[int, torch.Tensor]) -> None:
    for e, rows in rows_of.items():
        gate_up = product(rows, experts.gate_up_proj[e])
        product(gate_up[:, : gate_up.shape[1] // 2], experts.down_proj[e])


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--reps", type=int, default=20)


def run(args) -> dict:
    g = torch.Generator().manual_seed(0)
    experts = Experts(args.experts, args.hidden, args.inter)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(0.02 * torch.randn(p.shape, generator=g))
    backend = CpuPagedBackend(PagedKVCache(TINY_CONFIGS["gqa_tied"], 4, 4))
    rows = []
    for batch in args.batches:
        x = torch.randn(batch, args.hidden, generator=g)
        weights, ids = route(torch.randn(batch, args.experts, generator=g), args.top_k, renormalize=True)
        rows_of = {e: x[(ids == e).any(dim=1)].contiguous() for e in ids.unique().tolist()}
        with torch.no_grad():
            floor = median_of(products_only, experts, rows_of, repeats=args.reps)
            grouped = median_of(backend.experts_kernel, experts, x, weights, ids, repeats=args.reps)
        expert_bytes = 3 * args.hidden * args.inter * 4
        rows.append({"name": f"batch={batch}", "batch": batch, "distinct_experts": len(rows_of), "products_ms": floor * 1e3,
                     "grouped_ms": grouped * 1e3, "overhead": grouped / floor,
                     "products_GBps": len(rows_of) * expert_bytes / floor / 1e9})
    return {"kernels": "cpu", "shape": {"experts": args.experts, "hidden": args.hidden, "inter": args.inter, "top_k": args.top_k},
            "threads": torch.get_num_threads(), "rows": rows}


def report(result: dict) -> None:
    print(f"MoE experts on the CPU, float32, {result['shape']}, {result['threads']} threads")
    print(f"{'batch':>5} {'experts':>7} {'products ms':>11} {'grouped ms':>10} {'overhead':>8} {'GB/s':>6}")
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['distinct_experts']:>7} {r['products_ms']:>11.2f} {r['grouped_ms']:>10.2f} "
              f"{r['overhead']:>7.2f}x {r['products_GBps']:>6.1f}")


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.cpu.bench_moe_cpu")


if __name__ == "__main__":
    main()
