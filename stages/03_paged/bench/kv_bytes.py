"""Where a decode step's bytes go: the weights, read once per step whatever the batch, and every
running request's K/V, read once per step each. Arithmetic, no timing.

    python -m course.s03_paged.bench.kv_bytes [--context 320] [--results | --json out.json]

For SmolLM2-135M-Instruct (float32 weights, as the CPU serves them) at batch 1 and 64, each
request holding `--context` tokens, with the pool storing float32, bfloat16, int8 or fp8 (codes
and a scale byte per token and KV head: quantized_kv.py). final/bench/kv_cache.py measures
what the bytes turn into on our CPU.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.weights import load_model

from ..quantized_kv import KV_CACHE_DTYPES, pool_bytes_per_token

POOLS = ["float32", "bfloat16", "int8", "fp8"]
MB = 1e6


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", type=int, default=320, help="tokens each running request holds")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])


def run(args: argparse.Namespace) -> dict:
    model = load_model().model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for batch in args.batches:
        for pool in POOLS:
            per_token = pool_bytes_per_token(model.config, KV_CACHE_DTYPES[pool])
            kv = batch * args.context * per_token
            rows.append({"name": f"batch={batch}/{pool}", "batch": batch, "kv_cache_dtype": pool,
                         "bytes_per_token": per_token, "weights_mb": weights / MB, "kv_mb": kv / MB,
                         "kv_share": kv / (kv + weights), "step_mb": (kv + weights) / MB})
    for row in rows:
        base = next(r for r in rows if r["batch"] == row["batch"] and r["kv_cache_dtype"] == "float32")
        row["step_bytes_vs_float32"] = base["step_mb"] / row["step_mb"]
        row["tokens_vs_float32"] = base["bytes_per_token"] / row["bytes_per_token"]
    return {"model": "SmolLM2-135M-Instruct", "weights_dtype": str(torch.float32).removeprefix("torch."),
            "context": args.context, "rows": rows}


def report(result: dict) -> None:
    print(f"{result['model']}, float32 weights, {result['context']} tokens per request")
    for r in result["rows"]:
        print(f"{r['name']:<18} {r['bytes_per_token']:>6,} B/token  weights {r['weights_mb']:.0f} MB + K/V "
              f"{r['kv_mb']:7.1f} MB = {r['step_mb']:7.1f} MB a step (K/V {r['kv_share']:.0%}; "
              f"{r['step_bytes_vs_float32']:.2f}x fewer bytes than float32 K/V)")


main = bench_cli(__doc__, add_args, run, report, module="course.s03_paged.bench.kv_bytes")

if __name__ == "__main__":
    main()
