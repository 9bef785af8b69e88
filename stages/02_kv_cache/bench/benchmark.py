"""Benchmark: stage 01's naive loop vs the KV-cached loop, side by side in one run.

    python -m course.s02_kv_cache.bench.benchmark [--new-tokens 32 128 512] [--results | --json out.json]

Same prompt, greedy, float32, batch 1, the default model, warm-up excluded. For each length:
total time, TTFT, TPOT and the ratio naive/cached; transformers' cached `generate` as the
outside reference. Then per-token latency by position for the longest run (the JSON keeps
every token's time, for the notebook's plot).
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.generate import encode_prompt, generate_naive
from course.s01_decode_loop.bench.measure import bench_cli, per_token_seconds, timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model

from ..generate import generate_cached

PROMPT = "Write a short story about a robot who learns to paint."


def row_name(row: dict) -> str:
    """A row's name in the results, from its own fields: `new=512` (the tokens generated)."""
    return f"new={row['new_tokens']}"


def run(new_tokens: list[int]) -> dict:
    from transformers import AutoModelForCausalLM

    loaded = load_model()
    model, tok = loaded.model, loaded.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    ids = encode_prompt(tok, PROMPT, chat=True)

    def hf_generate(params):
        with torch.no_grad():
            return timed(hf.generate, torch.tensor([ids]), max_new_tokens=params.max_new_tokens,
                         min_new_tokens=params.max_new_tokens, do_sample=False)

    warm = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    generate_naive(model, tok, ids, warm), generate_cached(model, tok, ids, warm), hf_generate(warm)
    rows, traces = [], {}
    for n in new_tokens:
        params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
        naive = generate_naive(model, tok, ids, params)
        cached = generate_cached(model, tok, ids, params)
        assert naive.token_ids == cached.token_ids, "the cache changed the output"
        hf_s = hf_generate(params)
        n_total, c_total = naive.token_times_s[-1], cached.token_times_s[-1]
        rows.append({"name": row_name({"new_tokens": n}), "new_tokens": n, "prompt_tokens": len(ids),
                     "naive_s": n_total, "cached_s": c_total, "speedup": n_total / c_total,
                     "naive_ttft_ms": naive.ttft_s * 1e3, "cached_ttft_ms": cached.ttft_s * 1e3,
                     "naive_tpot_ms": naive.tpot_s * 1e3, "cached_tpot_ms": cached.tpot_s * 1e3,
                     "cached_tok_s": n / c_total, "hf_generate_s": hf_s, "hf_vs_cached": hf_s / c_total})
        traces[n] = {"naive": per_token_seconds(naive.token_times_s),
                     "cached": per_token_seconds(cached.token_times_s)}
    return {"rows": rows, "per_token_s": traces}


def print_report(result: dict, bucket: int = 64) -> None:
    print("float32, greedy, batch 1")
    print(f"{'new':>5} {'naive s':>8} {'cached s':>9} {'speedup':>8} {'TTFT naive/cached ms':>21} "
          f"{'TPOT naive/cached ms':>21} {'cached tok/s':>12} {'HF generate s':>13}")
    for r in result["rows"]:
        print(f"{r['new_tokens']:>5} {r['naive_s']:>8.2f} {r['cached_s']:>9.2f} {r['speedup']:>7.1f}x "
              f"{r['naive_ttft_ms']:>10.0f}/{r['cached_ttft_ms']:<10.0f} {r['naive_tpot_ms']:>10.0f}/"
              f"{r['cached_tpot_ms']:<10.0f} {r['cached_tok_s']:>12.1f} {r['hf_generate_s']:>13.2f}")
    longest = max(result["per_token_s"], key=int)
    trace, prompt = result["per_token_s"][longest], result["rows"][0]["prompt_tokens"]
    print(f"\nms per token by position ({longest} new tokens after a {prompt}-token prompt):")
    print(f"{'positions':>12} {'naive':>8} {'cached':>8}")
    for i in range(1, len(trace["naive"]), bucket):  # token 0 is the prefill (TTFT)
        j = min(i + bucket, len(trace["naive"]))
        mean = lambda xs: sum(xs[i:j]) / (j - i) * 1e3  # noqa: E731
        print(f"{prompt + i:>5}-{prompt + j - 1:<6} {mean(trace['naive']):>8.0f} {mean(trace['cached']):>8.1f}")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128, 512])


main = bench_cli(__doc__, add_args, lambda args: run(args.new_tokens), print_report,
                 module="course.s02_kv_cache.bench.benchmark")


if __name__ == "__main__":
    main()
