"""Benchmark: the naive loop (no KV cache) vs transformers' generate, side by side.

    python -m course.s01_decode_loop.bench.benchmark [--new-tokens 32 128] [--results | --json out.json]

Rows: our naive loop; transformers `generate(use_cache=False)`, the same algorithm in a
library; and transformers `generate` with its KV cache, the preview of stage 02. Greedy,
float32, batch 1, the default model, warm-up excluded. Ratios are against our naive loop.
"""
from __future__ import annotations

import argparse

import torch

from ..generate import encode_prompt, generate_naive
from .measure import bench_cli, best_of, write_json  # noqa: F401  (write_json: imported by later stages)
from ..sampling import SamplingParams
from ..weights import load_model

PROMPT = "Write a short story about a robot who learns to paint."
SHORT = {"ours: naive loop (no cache)": "naive", "transformers generate, use_cache=False": "hf-no-cache",
         "transformers generate, KV cache": "hf-cache"}


def row_name(row: dict) -> str:
    """A row's name in the results, from its own fields: `naive/128` (system / new tokens)."""
    return f"{SHORT[row['system']]}/{row['new_tokens']}"


def run(new_tokens: list[int], repeats: int = 1) -> list[dict]:
    from transformers import AutoModelForCausalLM

    loaded = load_model()
    tok, model = loaded.tokenizer, loaded.model
    hf = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    ids = encode_prompt(tok, PROMPT, chat=True)
    x = torch.tensor([ids])

    def ours(n):
        generate_naive(model, tok, ids, SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True))

    def hf_gen(n, cache):
        with torch.no_grad():
            hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=cache)

    systems = {"ours: naive loop (no cache)": ours,
               "transformers generate, use_cache=False": lambda n: hf_gen(n, False),
               "transformers generate, KV cache": lambda n: hf_gen(n, True)}
    for fn in systems.values():
        fn(4)  # warm-up: first-call allocations and thread pools
    rows = []
    for n in new_tokens:
        base = None
        for name, fn in systems.items():
            best = best_of(fn, n, repeats=repeats, warmup=0)
            base = base or best
            row = {"system": name, "prompt_tokens": len(ids), "new_tokens": n, "seconds": best,
                   "tokens_per_s": n / best, "speed_vs_naive": base / best}
            rows.append({"name": row_name(row), **row})
    return rows


def print_table(rows: list[dict]) -> None:
    print("float32, greedy, batch 1")
    print(f"{'system':42} {'new':>5} {'seconds':>8} {'tok/s':>7} {'x naive':>8}")
    for r in rows:
        print(f"{r['system']:42} {r['new_tokens']:>5} {r['seconds']:>8.2f} {r['tokens_per_s']:>7.1f} "
              f"{r['speed_vs_naive']:>8.2f}")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    p.add_argument("--repeats", type=int, default=1)


main = bench_cli(__doc__, add_args, lambda args: {"rows": run(args.new_tokens, args.repeats)},
                 lambda result: print_table(result["rows"]), module="course.s01_decode_loop.bench.benchmark")


if __name__ == "__main__":
    main()
