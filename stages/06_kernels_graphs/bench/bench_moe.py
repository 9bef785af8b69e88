"""A Qwen3-30B-A3B-shaped MoE layer's experts on the GPU (hidden 2,048, 128 experts, top-8,
experts 768 wide, bf16, random weights): the fused MoE kernel (gpu/fused_moe.py) against stage
04's per-expert loop, and against the time the chosen experts' bytes need at the card's
measured read bandwidth.

    python -m course.s06_kernels_graphs.bench.bench_moe [--dry-run] [--batches 1 2 4 8 16] [--json PATH]

At decode a step of B tokens reads only the experts they chose: about 8 distinct ones at B = 1
(75 MB of the layer's 1.2 GB), more as B grows. The ceiling of a step is those bytes over the
read bandwidth; `of_ceiling` is that time over the kernel's (1.0 = every byte at full speed).
The kernel is timed inside a CUDA graph (bench/ceilings.graph_time) cycling through several
routings, so no launch gap and no L2-resident expert flatters it; the loop cannot be captured
(it reads each expert's row count back to the host) and is timed eagerly, launch costs and
all, which is what running it costs. `--dry-run`: the CPU at tiny shapes, Triton interpreted;
it proves the plumbing of gpu_check.sh, its figures mean nothing.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli, median_of
from course.s01_decode_loop.moe.experts import Experts
from course.s01_decode_loop.moe.router import route
from course.s01_decode_loop.moe.grouped import grouped_experts

from ..gpu.fused_moe import QWEN3_30B_A3B, fused_moe
from .ceilings import graph_time

ROUTINGS = 4  # routings cycled through per batch size


def random_layer(shape: dict, dtype, device) -> Experts:
    experts = Experts(shape["experts"], shape["hidden"], shape["inter"]).to(device, dtype)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 0.02)
    return experts


def read_bandwidth(device, nbytes: int) -> float:
    """Bytes per second of a pass that only reads (torch's sum over a buffer past the L2)."""
    src = torch.randn(nbytes // 2, device=device, dtype=torch.bfloat16)
    return nbytes / graph_time(lambda: src.sum(dtype=torch.float32), launches=5)


def measure_batch(experts: Experts, shape: dict, batch: int, bandwidth: float, device, dtype) -> dict:
    g = torch.Generator().manual_seed(batch)
    cases = []
    for _ in range(ROUTINGS):
        x = torch.randn(batch, shape["hidden"], generator=g).to(device, dtype)
        weights, ids = route(torch.randn(batch, shape["experts"], generator=g), shape["top_k"], renormalize=True)
        cases.append((x, weights.to(device, dtype), ids.to(device)))
    with torch.no_grad():
        ref = grouped_experts(experts, *cases[0]).float()
        err = ((fused_moe(experts, *cases[0]).float() - ref).abs().max() / ref.abs().max()).item()
        fused_s = graph_time([lambda c=c: fused_moe(experts, *c) for c in cases], launches=8)
        loop_s = median_of(lambda: grouped_experts(experts, *cases[0]), repeats=5, device=device)
    expert_bytes = 3 * shape["hidden"] * shape["inter"] * experts.down_proj.element_size()
    distinct = sum(c[2].unique().numel() for c in cases) / len(cases)
    ceiling_s = distinct * expert_bytes / bandwidth
    return {"batch": batch, "distinct_experts": distinct, "bytes": distinct * expert_bytes,
            "fused_us": fused_s * 1e6, "loop_us": loop_s * 1e6, "ceiling_us": ceiling_s * 1e6,
            "of_ceiling": ceiling_s / fused_s, "loop_over_fused": loop_s / fused_s, "rel_err": err}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: the plumbing only, figures mean nothing")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])


def run(args) -> dict:
    dry = args.dry_run or not torch.cuda.is_available()
    shape = dict(hidden=64, experts=8, top_k=2, inter=32) if dry else QWEN3_30B_A3B
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    experts = random_layer(shape, dtype, device)
    bandwidth = read_bandwidth(device, 1 << 20 if dry else 1 << 30)
    rows = [measure_batch(experts, shape, b, bandwidth, device, dtype) for b in args.batches]
    return {"shape": shape, "dtype": str(dtype), "kernels": "gpu", "read_GBps": bandwidth / 1e9, "rows": rows,
            "dry_run": dry,
            "device": torch.cuda.get_device_name() if not dry else "cpu"}


def report(result: dict) -> None:
    where = "dry run on the CPU (figures mean nothing)" if result["dry_run"] else result["device"]
    print(f"MoE experts {result['shape']}, {result['dtype']}, {where}; read bandwidth {result['read_GBps']:.0f} GB/s")
    print(f"{'batch':>5} {'experts':>7} {'MB':>7} {'fused us':>9} {'loop us':>8} {'ceiling us':>10} "
          f"{'of ceiling':>10} {'loop/fused':>10} {'rel err':>8}")
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['distinct_experts']:>7.1f} {r['bytes'] / 1e6:>7.1f} {r['fused_us']:>9.1f} "
              f"{r['loop_us']:>8.1f} {r['ceiling_us']:>10.1f} {r['of_ceiling']:>10.0%} {r['loop_over_fused']:>10.1f} "
              f"{r['rel_err']:>8.1e}")


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.bench.bench_moe")


if __name__ == "__main__":
    main()
