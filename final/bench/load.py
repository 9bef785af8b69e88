"""The engine under load, in process: requests arrive as a Poisson process at several rates, and
each system serves the same arrivals (`python -m course.final.bench.engine --sections rates`).

Systems: speculation off, prompt lookup (k=4), EAGLE (k=2), and transformers `generate` as the
outside baseline (a static batcher: up to 8 arrived requests, left-padded, run to the longest).
Every request generates exactly its length (greedy, EOS ignored: stage 04's load benchmark
`serve`), so each system does the same work. Per request: TTFT (from arrival), TPOT; per run:
output tok/s. The plot shows throughput against the rate and the TTFT and TPOT CDFs at the
highest finite rate, one row per workload.
"""
from __future__ import annotations

import time

import torch

from course.s01_decode_loop.bench.workloads import arrival_times
from course.s04_continuous_batching.bench.benchmark import serve, serve_hf, summarize

from ..engine import SpeculativeConfig

LOAD_SYSTEMS = {"off": None, "lookup k=4": SpeculativeConfig("lookup", 4), "eagle k=2": SpeculativeConfig("eagle", 2)}
HF = "hf generate"


def run_rates(loaded, workloads: dict[str, list[tuple[list[int], int]]], rates: list[float], make_engine) -> list[dict]:
    """workloads: name -> [(prompt ids, output length)]; make_engine(spec) -> a fresh Engine."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    rows = []
    for workload, work in workloads.items():
        for rate in rates:
            arrivals = arrival_times(len(work), rate)
            for name, spec in [*LOAD_SYSTEMS.items(), (HF, None)]:
                start = time.perf_counter()
                metrics = serve_hf(hf, pad, work, arrivals) if name == HF else serve(make_engine(spec), work, arrivals)
                row = summarize(name, rate, metrics, time.perf_counter() - start)
                row |= {"workload": workload, "ttft": [m["ttft_s"] for m in metrics],
                        "tpot": [m["tpot_s"] for m in metrics]}
                rows.append(row)
                print(f"{workload:8s} rate {rate:>4} {name:12s} {row['output_tok_s']:6.1f} tok/s  TTFT p50 "
                      f"{row['ttft_p50']:6.2f} s p99 {row['ttft_p99']:6.2f} s  TPOT p50 {row['tpot_p50'] * 1e3:6.0f} ms")
    return rows


def plot_rates(rows: list[dict], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(len(workloads), 3, figsize=(14, 4 * len(workloads)), squeeze=False)
    for (thr, ttft, tpot), workload in zip(axes, workloads):
        mine = [r for r in rows if r["workload"] == workload]
        finite = [r["rate"] for r in mine if r["rate"] != float("inf")]
        loaded_rate = max(finite) if finite else float("inf")
        for system in dict.fromkeys(r["system"] for r in mine):
            runs = sorted((r for r in mine if r["system"] == system and r["rate"] in finite), key=lambda r: r["rate"])
            thr.plot([r["rate"] for r in runs], [r["output_tok_s"] for r in runs], "o-", label=system)
            at = next(r for r in mine if r["system"] == system and r["rate"] == loaded_rate)
            for ax, key in ((ttft, "ttft"), (tpot, "tpot")):
                xs = sorted(x for x in at[key] if x is not None)
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=system)
        thr.set(xlabel="request rate (req/s)", ylabel="output tok/s", title=f"{workload}: throughput")
        ttft.set(xlabel="TTFT (s)", ylabel="fraction of requests", title=f"{workload}: TTFT CDF at {loaded_rate} req/s")
        tpot.set(xlabel="TPOT (s)", ylabel="fraction of requests", title=f"{workload}: TPOT CDF at {loaded_rate} req/s",
                 xscale="log")
        for ax in (thr, ttft, tpot):
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
