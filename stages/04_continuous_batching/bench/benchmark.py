"""Load benchmark: requests arriving as a Poisson process, served by each scheduler in turn.

    python -m course.s04_continuous_batching.bench.benchmark [--requests 16] [--rates 0.5 2 inf]
                                                        [--max-output 32] [--results | --json out.json]

Requests are real ShareGPT prompts with their real answer lengths (capped at --max-output so a
2-core CPU finishes); every system generates exactly those lengths (greedy, EOS ignored), so
all rows do the same work. For each arrival rate (requests/s; inf = all at t=0):

  sequential       one request at a time (max_num_seqs=1)
  static           a batch runs to its longest member before anyone new joins
  continuous       iteration-level batching, whole prompts (no chunking)
  continuous+chunk iteration-level batching with chunked prefill (budget --budget tokens)
  hf generate      transformers, batches of waiting requests, left-padded, non-streaming

plus the machine's compute ceiling: measured float32 GEMM FLOP/s / (2 x params FLOPs per token).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.bench.measure import bench_cli, percentile, timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import arrival_times, sample_requests

from ..engine import EngineConfig, LLMEngine
from ..scheduler import Scheduler
from ..static_batching import StaticBatchScheduler

MAX_BATCH = 8


def serve(engine: LLMEngine, work: list[tuple[list[int], int]], arrivals: list[float]) -> list[dict]:
    """Feed requests at their arrival times, step the engine, return per-request metrics."""
    start, pending, ids = time.perf_counter(), list(range(len(work))), {}
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and arrivals[pending[0]] <= now:
            i = pending.pop(0)
            prompt, n_out = work[i]
            ids[i] = engine.add_request(prompt, SamplingParams(max_new_tokens=n_out, temperature=0, ignore_eos=True))
            engine.requests[ids[i]].seq.start_time = start + arrivals[i]  # latency counts from arrival
        if not engine.has_unfinished():
            time.sleep(max(0.0, arrivals[pending[0]] - now))
            continue
        engine.step()
    return [engine.requests[ids[i]].metrics() | {"tokens": work[i][1]} for i in range(len(work))]


def serve_hf(hf, pad_id: int, work, arrivals) -> list[dict]:
    """transformers' generate as a static batcher: take up to MAX_BATCH arrived requests, left-pad,
    generate to the longest, return all at the end (no streaming)."""
    start, pending, metrics = time.perf_counter(), list(range(len(work))), [None] * len(work)
    while pending:
        now = time.perf_counter() - start
        batch = [i for i in pending if arrivals[i] <= now][:MAX_BATCH]
        if not batch:
            time.sleep(arrivals[pending[0]] - now)
            continue
        pending = [i for i in pending if i not in batch]
        width = max(len(work[i][0]) for i in batch)
        ids = torch.tensor([[pad_id] * (width - len(work[i][0])) + work[i][0] for i in batch])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(work[i][0]) for i in batch])[:, None]).long()
        n_out = max(work[i][1] for i in batch)
        began = time.perf_counter() - start
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False,
                        pad_token_id=pad_id)
        done = time.perf_counter() - start
        for i in batch:
            e2e = done - arrivals[i]
            metrics[i] = {"queue_s": began - arrivals[i], "ttft_s": e2e, "tpot_s": (done - began) / n_out,
                          "e2e_s": e2e, "tokens": work[i][1]}
    return metrics


def gemm_flops(reps: int = 20) -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    return 2 * 1024 ** 3 * reps / timed(lambda: [a @ b for _ in range(reps)])


def row_name(row: dict) -> str:
    """A row's name in the results, from its own fields: `continuous+chunk/rate=inf` (system / arrival rate)."""
    return f"{row['system'].replace(' ', '-')}/rate={row['rate']:g}"


def summarize(name: str, rate: float, metrics: list[dict], wall: float) -> dict:
    def pct(key, q):
        return percentile([m[key] for m in metrics if m[key] is not None], q)
    return {"system": name, "rate": rate, "output_tok_s": sum(m["tokens"] for m in metrics) / wall,
            "ttft_p50": pct("ttft_s", 50), "ttft_p99": pct("ttft_s", 99), "tpot_p50": pct("tpot_s", 50),
            "tpot_p99": pct("tpot_s", 99), "e2e_p50": pct("e2e_s", 50), "wall_s": wall}


def run(n_requests: int, rates: list[float], max_output: int, budget: int) -> dict:
    from transformers import AutoModelForCausalLM

    loaded = load_model()
    model, tok = loaded.model, loaded.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    reqs = sample_requests(tok, n_requests, seed=0, max_prompt_tokens=512)
    work = [(encode_prompt(tok, r.prompt, chat=True), min(r.output_len, max_output)) for r in reqs]
    big = 2048
    systems = {
        "sequential": dict(config=EngineConfig(num_blocks=1024, max_num_seqs=1, max_num_batched_tokens=big,
                                               enable_chunked_prefill=False)),
        "static": dict(config=EngineConfig(num_blocks=1024, max_num_seqs=MAX_BATCH, max_num_batched_tokens=big,
                                           enable_chunked_prefill=False), scheduler_cls=StaticBatchScheduler),
        "continuous": dict(config=EngineConfig(num_blocks=1024, max_num_seqs=32, max_num_batched_tokens=big,
                                               enable_chunked_prefill=False), scheduler_cls=Scheduler),
        "continuous+chunk": dict(config=EngineConfig(num_blocks=1024, max_num_seqs=32, max_num_batched_tokens=budget)),
    }
    rows = []
    LLMEngine(model, tok).generate([work[0][0]], SamplingParams(max_new_tokens=2))  # warm-up
    for rate in rates:
        arrivals = arrival_times(n_requests, rate)
        for name, kw in systems.items():
            engine = LLMEngine(model, tok, eos_token_ids=loaded.eos_token_ids, **kw)
            t = time.perf_counter()
            metrics = serve(engine, work, arrivals)
            rows.append(summarize(name, rate, metrics, time.perf_counter() - t))
        t = time.perf_counter()
        metrics = serve_hf(hf, tok.pad_token_id if tok.pad_token_id is not None else 0, work, arrivals)
        rows.append(summarize("hf generate", rate, metrics, time.perf_counter() - t))
    rows = [{"name": row_name(row), **row} for row in rows]
    flops = gemm_flops()
    params = sum(p.numel() for p in model.parameters())
    return {"requests": n_requests, "mean_prompt": statistics.mean(len(p) for p, _ in work),
            "mean_output": statistics.mean(n for _, n in work), "budget": budget,
            "gemm_gflops": flops / 1e9, "ceiling_tok_s": flops / (2 * params), "rows": rows}


def print_report(r: dict) -> None:
    print(f"float32; {r['requests']} ShareGPT requests, mean prompt {r['mean_prompt']:.0f}, "
          f"mean output {r['mean_output']:.0f} tokens; chunk budget {r['budget']}")
    print(f"compute ceiling: {r['gemm_gflops']:.0f} GFLOP/s float32 GEMM / (2 x params) = "
          f"{r['ceiling_tok_s']:.0f} tok/s")
    print(f"{'rate':>5} {'system':>17} {'tok/s':>6} {'of ceil':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'TPOT p50':>9} {'TPOT p99':>9} {'e2e p50':>8}")
    for row in r["rows"]:
        f = lambda x: f"{x:9.2f}" if x is not None else f"{'-':>9}"  # noqa: E731
        print(f"{row['rate']:>5} {row['system']:>17} {row['output_tok_s']:6.1f} "
              f"{row['output_tok_s'] / r['ceiling_tok_s']:7.1%} {f(row['ttft_p50'])} {f(row['ttft_p99'])} "
              f"{f(row['tpot_p50'])} {f(row['tpot_p99'])} {row['e2e_p50']:8.2f}")
    for rate in sorted({row["rate"] for row in r["rows"]}):
        by = {row["system"]: row["output_tok_s"] for row in r["rows"] if row["rate"] == rate}
        print(f"rate {rate}: continuous+chunk / sequential {by['continuous+chunk'] / by['sequential']:.2f}x, "
              f"/ hf generate {by['continuous+chunk'] / by['hf generate']:.2f}x, / static "
              f"{by['continuous+chunk'] / by['static']:.2f}x")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0, float("inf")])
    p.add_argument("--max-output", type=int, default=32)
    p.add_argument("--budget", type=int, default=128)


main = bench_cli(__doc__, add_args, lambda args: run(args.requests, args.rates, args.max_output, args.budget),
                 print_report, module="course.s04_continuous_batching.bench.benchmark")


if __name__ == "__main__":
    main()
