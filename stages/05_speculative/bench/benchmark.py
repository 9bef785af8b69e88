"""Speculative decoding on three workloads, every method, k = 1..6, against stage 02 in one run.

    python -m course.s05_speculative.bench.benchmark [--prompts 2] [--max-new-tokens 64] [--ks 1 2 3 4 5 6]
                                               [--methods draft lookup eagle eagle-tree] [--repeats 1]
                                               [--results | --json out.json]
    python -m course.s05_speculative.bench.benchmark --verify-cost   # what a k-token verify costs here

Workloads (batch 1, greedy, the default model, chat template):
  chat       ShareGPT first turns the EAGLE head never saw (its training run's held-out split)
  rewrite    "Rewrite / summarise this text": the answer quotes its input (prompt lookup's case)
  json       "Answer with a JSON object with these keys": structured, repetitive output

For every (workload, method, k) the rows report the mean accepted length (tokens emitted per
target forward; 1.0 = no gain), the acceptance rate of drafted tokens, and the wall-clock
speedup: stage 02's decode time / this method's, same prompts, same tokens (every method's
greedy output is checked equal to stage 02's; where the two part at a near tie, a pair of
logits within 1e-3, the row says so: see `compare`). Times are of the whole generation after a
warm-up, so prefill is in both.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from course.s01_decode_loop.generate import encode_prompt, next_token_logits
from course.s01_decode_loop.bench.measure import bench_cli, cpu_threads, median_of, timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import load_conversations, sample_requests
from course.s02_kv_cache.generate import stream_cached

from ..draft_model import DraftModelDrafter, truncated_model
from ..eagle import DEFAULT_HEAD, EagleDrafter, EagleHead
from ..prompt_lookup import PromptLookupDrafter
from ..speculative import SpecStats, measure_verify_cost, stream_speculative, stream_tree_speculative, verifier

JSON_SUBJECTS = ["the planet Mars", "a cup of coffee", "the Python programming language", "a mountain bike",
                 "the city of Paris", "a honeybee"]
TREE = {"top_k": 4, "max_nodes": 16}  # EAGLE-2's shape scaled down for a CPU; depth = k; sized by the verify cost


def workloads(tokenizer, n: int) -> dict[str, list[str]]:
    """n prompts per workload. Chat prompts come from the EAGLE training run's held-out split."""
    held_out = sample_requests(tokenizer, 416, seed=0, max_prompt_tokens=192)[384:]
    chat = [r.prompt for r in held_out[:n]]
    texts = [c[1]["value"] for c in load_conversations(4000)[3000:]
             if len(c) > 1 and c[1]["from"] == "gpt" and 400 < len(c[1]["value"]) < 900][:n]
    rewrite = [f"{'Rewrite the following text in plain words' if i % 2 else 'Summarize the following text'}:\n\n{t}"
               for i, t in enumerate(texts)]
    structured = [f'Describe {s} as a JSON object with the keys "name", "category", "description", "facts" '
                  "(a list of three short strings). Answer with the JSON only." for s in JSON_SUBJECTS[:n]]
    return {"chat": chat, "rewrite": rewrite, "json": structured}


def compare(model, prompt_ids: list[int], want: list[int], got: list[int], tol: float = 1e-3) -> str:
    """'equal'; 'near tie' when the outputs part where the reference's logits for the two
    tokens are within `tol` (float32 sums taken in another order, a wider verify matmul or
    another thread count, can flip such an argmax: that is rounding, not a bug); else 'differs'."""
    if got == want:
        return "equal"
    i = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if i is None:  # one is a prefix of the other: they did not part on a token
        return "differs"
    logits = next_token_logits(model, prompt_ids + want[:i])
    return "near tie" if abs(float(logits[want[i]] - logits[got[i]])) < tol else "differs"


def run_timed(stream_fn, seq: Sequence) -> float:
    """Seconds to stream `seq` to its end."""
    return timed(list, stream_fn(seq))


def named(row: dict) -> dict:
    """The row with its name first, made of its own fields (a rerun names it alike): `chat/eagle/k=1`,
    `rewrite/lookup/k=2`, `json/stage02/k=0` for the baseline."""
    return {"name": f"{row['workload']}/{row['method'].replace(' ', '')}/k={row['k']}", **row}


def run(n_prompts: int = 2, max_new_tokens: int = 64, ks=(1, 2, 3, 4, 5, 6),
        methods=("draft", "lookup", "eagle", "eagle-tree"), draft_layers: int = 4, repeats: int = 1) -> dict:
    """The table. Each row's time is the median of `repeats` runs over its prompts (a row run once
    moves by about 5% on a 2-core machine: enough to swap two methods within a few percent)."""
    loaded = load_model()
    model, tok, eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0)
    drafters = {"draft": DraftModelDrafter(truncated_model(model, draft_layers)), "lookup": PromptLookupDrafter()}
    if any(m.startswith("eagle") for m in methods):
        drafters["eagle"] = drafters["eagle-tree"] = EagleDrafter(EagleHead.load(DEFAULT_HEAD, model), model)
    cost = measure_verify_cost(model) if "eagle-tree" in methods else None  # what a t-token verify costs here

    def baseline(seq):
        return stream_cached(model, seq)

    warm = Sequence(encode_prompt(tok, "Hi", chat=True), SamplingParams(max_new_tokens=4, temperature=0), tok, eos)
    run_timed(baseline, warm)
    rows = []
    for name, prompts in workloads(tok, n_prompts).items():
        ids = [encode_prompt(tok, p, chat=True) for p in prompts]
        base_out, base_times = [], []
        for _ in range(repeats):
            base_times.append(0.0)
            for p in ids:
                seq = Sequence(p, params, tok, eos)
                base_times[-1] += run_timed(baseline, seq)
                base_out.append(seq.output_ids)
        base_time, base_out = statistics.median(base_times), base_out[:len(ids)]
        tokens = sum(len(o) for o in base_out)
        rows.append(named({"workload": name, "method": "stage 02", "k": 0, "tokens": tokens, "seconds": base_time,
                           "mean_accepted_length": 1.0, "acceptance_rate": None, "speedup": 1.0, "equal": True}))
        for method in methods:
            for k in ks:
                times, verdicts = [], []
                for _ in range(repeats):  # the statistics and verdicts of the last run (every run drafts alike)
                    stats, times = SpecStats(), times + [0.0]
                    for p, ref in zip(ids, base_out):
                        seq = Sequence(p, params, tok, eos)
                        if method == "eagle-tree":
                            fn = lambda s: stream_tree_speculative(model, s, drafters[method], k,  # noqa: E731
                                                                   stats=stats, verify_cost=cost, **TREE)
                        else:
                            fn = lambda s: stream_speculative(model, s, drafters[method], k, stats=stats)  # noqa: E731
                        times[-1] += run_timed(fn, seq)
                        verdicts.append(compare(model, p, ref, seq.output_ids))
                seconds, verdicts = statistics.median(times), verdicts[-len(ids):]
                equal = "differs" not in verdicts  # a near tie is reported, not counted as a bug
                rows.append(named({"workload": name, "method": method, "k": k, "tokens": tokens, "seconds": seconds,
                                   "mean_accepted_length": stats.mean_accepted_length,
                                   "acceptance_rate": stats.acceptance_rate, "speedup": base_time / seconds,
                                   "equal": equal, "near_ties": verdicts.count("near tie")}))
                print(f"{name:>8} {method:>10} k={k} accepted length {stats.mean_accepted_length:4.2f} "
                      f"speedup {base_time / seconds:4.2f}x{_flag(rows[-1])}", flush=True)
    return {"prompts_per_workload": n_prompts, "max_new_tokens": max_new_tokens, "draft_layers": draft_layers,
            "repeats": repeats,
            "tree": TREE | {"depth": "k", "sized_by": "verify cost"}, "rows": rows}


def verify_cost(model, context: int = 128, widths=(1, 2, 3, 4, 5, 7, 17), reps: int = 10) -> dict[int, float]:
    """Seconds for one target forward over `width` new tokens after `context` cached ones (the
    verify step of k = width - 1), median of `reps`. Speculation pays only while the accepted
    length grows faster than this cost."""
    verify = verifier(model, context, max(widths))
    return {width: median_of(verify, width, repeats=reps, warmup=0) for width in widths}


def print_table(result: dict) -> None:
    print(f"float32; {result['prompts_per_workload']} prompts per workload, "
          f"{result['max_new_tokens']} new tokens, greedy, batch 1")
    print(f"{'workload':>8} {'method':>10} {'k':>2} {'acc.len':>7} {'acc.rate':>8} {'speedup':>7}")
    for r in result["rows"]:
        rate = f"{r['acceptance_rate']:8.2f}" if r["acceptance_rate"] is not None else f"{'-':>8}"
        print(f"{r['workload']:>8} {r['method']:>10} {r['k']:>2} {r['mean_accepted_length']:7.2f} {rate} "
              f"{r['speedup']:6.2f}x" + _flag(r))


def _flag(row: dict) -> str:
    if not row["equal"]:
        return "  OUTPUT DIFFERS"
    return f"  ({row['near_ties']} output(s) parted at a near tie)" if row.get("near_ties") else ""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    p.add_argument("--methods", nargs="+", default=["draft", "lookup", "eagle", "eagle-tree"])
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="each row's time: the median of this many runs")
    p.add_argument("--verify-cost", action="store_true", help="only time target forwards of 1..17 tokens")


def run_cli(args: argparse.Namespace) -> dict:
    torch.set_num_threads(cpu_threads())
    if args.verify_cost:
        if args.results:  # results/benchmark.json holds the method table; this mode only prints
            raise SystemExit("--verify-cost does not write results/benchmark.json; use --json PATH")
        return {"verify_cost_s": verify_cost(load_model().model)}
    return run(args.prompts, args.max_new_tokens, args.ks, args.methods, args.draft_layers, args.repeats)


def report(result: dict) -> None:
    if "verify_cost_s" not in result:
        return print_table(result)
    costs = result["verify_cost_s"]
    for width, seconds in costs.items():
        print(f"forward over {width:2} tokens: {seconds * 1e3:6.1f} ms = {seconds / costs[1]:.2f}x one token")


main = bench_cli(__doc__, add_args, run_cli, report, module="course.s05_speculative.bench.benchmark")


if __name__ == "__main__":
    main()
