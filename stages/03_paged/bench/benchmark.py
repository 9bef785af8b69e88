"""Benchmark: what paging and prefix caching buy, measured in one run.

    python -m course.s03_paged.bench.benchmark [--requests 500] [--questions 6] [--results | --json out.json]

1. Memory: how many ShareGPT requests fit at once in a fixed KV budget, with stage 02's
   contiguous reservation of prompt + max_new_tokens vs paged blocks (a simulation, no model).
2. Prefix caching: TTFT of chat requests that share a long system prompt, on the default
   model, with prefix caching off (every prefill computes the whole prompt) vs on (requests
   after the first compute only what follows the shared blocks).
"""
from __future__ import annotations

import argparse
import statistics

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import load_conversations, sample_requests

from ..engine import PagedGenerator
from ..memory_sim import simulate

QUESTIONS = ["What is this text about?", "Summarize it in one sentence.", "Who is the intended reader?",
             "List three key terms it uses.", "What would you ask the author?", "Is anything unclear?",
             "Give it a title.", "What is the tone?"]


def row_name(row: dict) -> str:
    """A memory row's name in the results, from its own fields: `budget=16384` (KV tokens)."""
    return f"budget={row['budget_tokens']}"


def memory_report(tokenizer, n_requests: int, budgets: list[int], block_size: int = 16,
                  max_new_tokens: int = 1024) -> dict:
    requests = sample_requests(tokenizer, n_requests, seed=0)
    lengths = [(len(tokenizer.encode(r.prompt, add_special_tokens=False)), r.output_len) for r in requests]
    rows = [{"name": row_name({"budget_tokens": b}), "budget_tokens": b,
             **simulate(lengths, b, block_size, max_new_tokens)} for b in budgets]
    return {"requests": n_requests, "block_size": block_size, "max_new_tokens": max_new_tokens,
            "mean_prompt": statistics.mean(p for p, _ in lengths),
            "mean_output": statistics.mean(o for _, o in lengths), "rows": rows}


def long_system_prompt(tokenizer, min_tokens: int) -> str:
    """A real long text from ShareGPT to play the shared system prompt (a document, a policy)."""
    for conv in load_conversations():
        text = next((t["value"] for t in conv if t["from"] == "human"), "")
        if min_tokens <= len(tokenizer.encode(text)) <= 2 * min_tokens and text.isascii():
            return text
    raise RuntimeError(f"no ShareGPT prompt of {min_tokens} tokens found")


def prefix_ttft(loaded, n_questions: int, system_tokens: int, block_size: int = 16) -> dict:
    model, tok = loaded.model, loaded.tokenizer
    system = long_system_prompt(tok, system_tokens)
    prompts = [encode_prompt(tok, q, chat=True, system=system) for q in QUESTIONS[:n_questions]]
    params = SamplingParams(max_new_tokens=1, temperature=0)
    num_blocks = 2 * max(len(p) for p in prompts) // block_size + 8
    result = {"prompt_tokens": [len(p) for p in prompts]}
    warm = PagedGenerator(model, num_blocks, block_size)  # run once so first-call costs are paid
    list(warm(model, Sequence(prompts[0][:64], params, tok)))
    for caching in (False, True):
        gen = PagedGenerator(model, num_blocks, block_size, enable_prefix_caching=caching)
        ttfts, tokens = [], []
        for ids in prompts:
            seq = Sequence(ids, params, tok)
            before = gen.computed_prompt_tokens
            list(gen(model, seq))
            ttfts.append(seq.output().ttft_s)
            tokens.append(gen.computed_prompt_tokens - before)
        result["caching_on" if caching else "caching_off"] = {"ttft_s": ttfts, "computed_tokens": tokens}
    off, on = result["caching_off"]["ttft_s"], result["caching_on"]["ttft_s"]
    result["cold_ttft_s"] = statistics.mean(off)
    result["warm_ttft_s"] = statistics.mean(on[1:])
    result["speedup"] = result["cold_ttft_s"] / result["warm_ttft_s"]
    return result


def print_report(mem: dict, pre: dict) -> None:
    print(f"1. memory: {mem['requests']} ShareGPT requests (mean prompt {mem['mean_prompt']:.0f}, mean answer "
          f"{mem['mean_output']:.0f} tokens), block {mem['block_size']}, max_new_tokens {mem['max_new_tokens']}")
    print(f"{'KV budget':>10} {'contiguous':>11} {'paged':>6} {'ratio':>6} {'util contig':>12} {'util paged':>11}")
    for r in mem["rows"]:
        c, p = r["contiguous"], r["paged"]
        print(f"{r['budget_tokens']:>10} {c['admitted']:>11} {p['admitted']:>6} {r['ratio']:>5.2f}x "
              f"{c['utilization']:>12.1%} {p['utilization']:>11.1%}")
    print(f"\n2. prefix caching: {len(pre['prompt_tokens'])} chat requests sharing a system prompt "
          f"({min(pre['prompt_tokens'])}-{max(pre['prompt_tokens'])} tokens each)")
    print(f"{'request':>8} {'TTFT off ms':>12} {'TTFT on ms':>11} {'computed off':>13} {'computed on':>12}")
    off, on = pre["caching_off"], pre["caching_on"]
    for i in range(len(pre["prompt_tokens"])):
        print(f"{i:>8} {off['ttft_s'][i] * 1e3:>12.0f} {on['ttft_s'][i] * 1e3:>11.0f} "
              f"{off['computed_tokens'][i]:>13} {on['computed_tokens'][i]:>12}")
    print(f"mean TTFT cold (caching off) {pre['cold_ttft_s'] * 1e3:.0f} ms, warm (caching on, requests 1..) "
          f"{pre['warm_ttft_s'] * 1e3:.0f} ms: {pre['speedup']:.1f}x")


def run(args: argparse.Namespace) -> dict:
    loaded = load_model()
    return {"memory": memory_report(loaded.tokenizer, args.requests, args.budgets),
            "prefix": prefix_ttft(loaded, args.questions, args.system_tokens)}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--budgets", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--questions", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=600)


main = bench_cli(__doc__, add_args, run, lambda result: print_report(result["memory"], result["prefix"]),
                 module="course.s03_paged.bench.benchmark")


if __name__ == "__main__":
    main()
