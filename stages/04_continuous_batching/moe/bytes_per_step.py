"""Bytes one decode step reads, against the batch size: a dense model and a Mixture-of-Experts
model of the same total size.

    python -m course.s04_continuous_batching.moe.bytes_per_step [--batches 1 2 4 ...] [--results]

A dense model's decode step reads every weight once, whatever the batch: 1 token or 256, the
same bytes (that is why batching decode is nearly free). An MoE step reads the shared weights
(attention, norms, embeddings, router) plus only the experts its tokens chose, and each chosen
expert once however many of the step's tokens chose it (grouped.py). So the bytes grow with
the batch until every expert is touched:

    distinct experts of a layer at batch B  ~  E * (1 - (1 - k/E)^B)   (tokens routed independently)

Here the distinct experts are counted from routings, not from the formula: B random hidden
states through a random router (softmax, top-k), averaged over trials, for every MoE layer;
the formula is printed beside them. Shapes are the real models' (Qwen3-30B-A3B, Mixtral-8x7B),
bf16; the "dense" row is a dense model of the same total bytes.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.moe.router import route

MODELS = {  # layers, hidden, experts, top-k, expert width, attention q/kv heads, head dim, vocab
    "Qwen3-30B-A3B": dict(layers=48, hidden=2048, experts=128, top_k=8, inter=768, heads=32, kv_heads=4,
                          head_dim=128, vocab=151936),
    "Mixtral-8x7B": dict(layers=32, hidden=4096, experts=8, top_k=2, inter=14336, heads=32, kv_heads=8,
                         head_dim=128, vocab=32000),
}
BYTES = 2  # bf16


def shared_params(m: dict) -> int:
    """Everything a step reads whatever the routing: attention, norms, router, embeddings + head."""
    attn = m["hidden"] * (m["heads"] + 2 * m["kv_heads"]) * m["head_dim"] + m["heads"] * m["head_dim"] * m["hidden"]
    per_layer = attn + 2 * m["hidden"] + m["experts"] * m["hidden"]
    return m["layers"] * per_layer + 2 * m["vocab"] * m["hidden"]


def expert_params(m: dict) -> int:
    return 3 * m["hidden"] * m["inter"]  # gate, up, down


def distinct_experts(m: dict, batch: int, trials: int, g: torch.Generator) -> float:
    """Mean distinct experts one layer's step touches: B random tokens through a random router."""
    gate = torch.randn(m["experts"], m["hidden"], generator=g) / m["hidden"] ** 0.5
    total = 0
    for _ in range(trials):
        x = torch.randn(batch, m["hidden"], generator=g)
        _, ids = route(x @ gate.T, m["top_k"], renormalize=True)
        total += ids.unique().numel()
    return total / trials


def row_name(row: dict) -> str:
    """A row's name in the results, from its own fields: `batch=64` (tokens in the step)."""
    return f"batch={row['batch']}"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--trials", type=int, default=20, help="routings averaged per batch size")


def run(args) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, m in MODELS.items():
        shared, expert = shared_params(m) * BYTES, expert_params(m) * BYTES
        total = shared + m["layers"] * m["experts"] * expert
        rows = []
        for b in args.batches:
            touched = distinct_experts(m, b, args.trials, g)
            moe = shared + m["layers"] * touched * expert
            rows.append({"name": row_name({"batch": b}), "batch": b, "distinct_experts": touched,
                         "expected_uniform": m["experts"] * (1 - (1 - m["top_k"] / m["experts"]) ** b),
                         "moe_GB": moe / 1e9, "dense_GB": total / 1e9, "moe_fraction": moe / total,
                         "moe_GB_per_token": moe / 1e9 / b})
        out[name] = {"shape": m, "total_GB": total / 1e9, "shared_GB": shared / 1e9,
                     "expert_MB": expert / 1e6, "rows": rows}
    return {"models": out, "dtype": "bfloat16", "trials": args.trials}


def report(result: dict) -> None:
    for name, r in result["models"].items():
        m = r["shape"]
        print(f"\n{name}: {r['total_GB']:.1f} GB in bf16 ({r['shared_GB']:.1f} GB shared, {m['layers']} layers x "
              f"{m['experts']} experts of {r['expert_MB']:.1f} MB, top-{m['top_k']})")
        print(f"{'batch':>5} {'experts/layer':>13} {'formula':>8} {'MoE GB/step':>11} {'dense GB/step':>13} "
              f"{'MoE/dense':>9} {'MoE GB/token':>12}")
        for row in r["rows"]:
            print(f"{row['batch']:>5} {row['distinct_experts']:>13.1f} {row['expected_uniform']:>8.1f} "
                  f"{row['moe_GB']:>11.2f} {row['dense_GB']:>13.2f} {row['moe_fraction']:>9.0%} "
                  f"{row['moe_GB_per_token']:>12.3f}")


main = bench_cli(__doc__, add_args, run, report, module="course.s04_continuous_batching.moe.bytes_per_step")


if __name__ == "__main__":
    main()
