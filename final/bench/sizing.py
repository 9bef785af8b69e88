"""How big a step and a batch should be on this CPU: the standard load under each sizing.

    python -m course.final.bench.sizing                     # 32/64/128 sequences x 256..2048 tokens
    python -m course.final.bench.sizing --results           # writes final/results/sizing.json

Runs vLLM's ShareGPT benchmark shape (standard_load.py: 40 raw prompts of ~236 tokens at once,
128 tokens each, greedy) in process, on fresh engines with the server's kernel defaults, for
every pair of `max_num_seqs` and `max_num_batched_tokens`, with a pool that holds them all.
For each it prints output tok/s, prompt+output tok/s and the longest step (how long a prefill
chunk stalls the decodes beside it). The server's start-up rule (launch/sizing.py) is read
off this table: the smallest budget and batch within a few percent of the best throughput.
"""
from __future__ import annotations

import argparse
import time

import torch

from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

from ..engine import Engine
from ..launch.kernel_defaults import kernel_defaults
from .standard_load import standard_requests


def run_load(loaded, work, max_num_seqs: int, budget: int, num_blocks: int) -> dict:
    config = KernelEngineConfig(num_blocks=num_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                record_steps=False, **kernel_defaults("cpu", torch.float32))
    engine = Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids, prefetch_masks=False)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, temperature=0))  # first-call costs
    for prompt, params in work:
        engine.add_request(prompt, params)
    steps, longest, start = 0, 0.0, time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        longest, steps = max(longest, time.perf_counter() - t), steps + 1
    seconds = time.perf_counter() - start
    prompt_tokens = sum(len(p) for p, _ in work)
    output_tokens = sum(p.max_new_tokens for _, p in work)
    return {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget, "steps": steps, "seconds": seconds,
            "output_tok_s": output_tokens / seconds, "total_tok_s": (prompt_tokens + output_tokens) / seconds,
            "longest_step_s": longest}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--kv-blocks", type=int, default=2048, help="enough for every request at once")


def run(args: argparse.Namespace) -> dict:
    loaded = load_model(dtype=torch.float32)
    tok = loaded.tokenizer
    work = [(tok.encode(prompt, add_special_tokens=False), SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True))
            for prompt, n in standard_requests(tok, args.num_requests)]
    rows = []
    for seqs in args.max_num_seqs:
        for budget in args.budgets:
            rows.append(run_load(loaded, work, seqs, budget, args.kv_blocks))
            print_row(rows[-1], flush=True)
    return {"workload": f"standard: {len(work)} requests, mean prompt "
                        f"{sum(len(p) for p, _ in work) / len(work):.0f} tokens, 128 out", "rows": rows}


def print_row(r: dict, flush: bool = False) -> None:
    print(f"max_num_seqs {r['max_num_seqs']:4d} budget {r['max_num_batched_tokens']:5d}: "
          f"{r['output_tok_s']:6.1f} output tok/s, {r['total_tok_s']:6.1f} prompt+output tok/s, "
          f"{r['steps']} steps, longest {1e3 * r['longest_step_s']:6.0f} ms", flush=flush)


def report(result: dict) -> None:
    print(result["workload"])
    for r in result["rows"]:
        print_row(r)


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.sizing")

if __name__ == "__main__":
    main()
