"""What a sliding window saves a decode step's attention, measured on this CPU, side by side.

    python -m course.s06_kernels_graphs.cpu.bench_windows [--context 1024 4096 16384] [--json out.json | --results]

One layer's attention for 32 decoding sequences at `context` tokens each (SmolLM2-135M's heads:
9 query heads on 3 KV heads of 64, float32 pool, blocks of 16), through attention.c with no
window and with windows of 512 and 4096 (Mistral's), and through the torch backend's gather
(`decode_attention_gather`, which masks the window but reads every block). Median of 7 after a
warm-up, on torch's thread count. A window bounds the keys a row reads, so the C kernel's time
should stop growing with the context once it passes the window; the gather's does not.
"""
from __future__ import annotations

import torch

from course.s01_decode_loop.bench.measure import bench_cli, median_of

from ..torch_backend import decode_attention_gather
from .attention import paged_attention_rows

ROWS, HEADS, KV_HEADS, DIM, BLOCK = 32, 9, 3, 64, 16
WINDOWS = (None, 4096, 512)


def run_all(args) -> dict:
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for context in args.context:
        per_seq = -(-context // BLOCK)
        k_pool = torch.randn(ROWS * per_seq + 1, BLOCK, KV_HEADS, DIM, generator=g)
        v_pool = torch.randn(ROWS * per_seq + 1, BLOCK, KV_HEADS, DIM, generator=g)
        tables = torch.randperm(ROWS * per_seq, generator=g).view(ROWS, per_seq)  # scattered blocks
        q = torch.randn(ROWS, HEADS, DIM, generator=g)
        lens = torch.full((ROWS,), context, dtype=torch.long)
        every = torch.arange(ROWS)
        for window in WINDOWS:
            if window is not None and window >= context:
                continue
            c_ms = 1e3 * median_of(lambda: paged_attention_rows(q, k_pool, v_pool, tables, every, every, lens,
                                                                 window=window), repeats=7)
            gather_ms = 1e3 * median_of(lambda: decode_attention_gather(q, k_pool, v_pool, tables, lens, window),
                                        repeats=7)
            rows_out.append({"name": f"{context}/{window or 'none'}", "context": context, "window": window,
                             "c_ms": c_ms, "gather_ms": gather_ms})
    for r in rows_out:
        full = next(x for x in rows_out if x["context"] == r["context"] and x["window"] is None)
        r["c_full_over_windowed"] = full["c_ms"] / r["c_ms"]
        r["gather_over_c"] = r["gather_ms"] / r["c_ms"]
    return {"threads": torch.get_num_threads(), "rows_per_step": ROWS, "rows": rows_out}


def report(result: dict) -> None:
    print(f"{'context':>8} {'window':>7} {'C ms':>8} {'gather ms':>10} {'C full/windowed':>16} {'gather/C':>9}")
    for r in result["rows"]:
        print(f"{r['context']:>8} {str(r['window'] or '-'):>7} {r['c_ms']:8.2f} {r['gather_ms']:10.2f} "
              f"{r['c_full_over_windowed']:15.2f}x {r['gather_over_c']:8.2f}x")


def add_args(p) -> None:
    p.add_argument("--context", type=int, nargs="+", default=[1024, 4096, 16384])


main = bench_cli(__doc__, add_args, run_all, report, module="course.s06_kernels_graphs.cpu.bench_windows")

if __name__ == "__main__":
    main()
