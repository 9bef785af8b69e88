"""Speculation inside the batch, on and off, side by side in one run.

    python -m course.final.bench_engine [--requests 8] [--max-output 64] [--concurrency 1 8]
                                        [--sections speculation features] [--json out.json]

Two workloads on the default model (greedy, chat template, EOS honoured so every system emits
the same tokens):
  chat     ShareGPT first turns (answers rarely quote the prompt: prompt lookup finds little)
  rewrite  "repeat/fix this text" requests (answers quote the prompt: lookup's best case)
At each concurrency (requests in flight at once; 1 = single stream) every system serves the
same requests: speculation off, prompt lookup and EAGLE (stage 05's head) with k = 2 and 4. Printed: output tok/s,
the ratio to "off", drafted tokens accepted, and tokens emitted per verifying forward. Then,
on the chat workload at the highest concurrency, the engine's features one at a time (prefix
caching, chunked prefill, stage 06's runner against stage 04's engine, fused weights).
"""
from __future__ import annotations

import argparse
import time

from course.s01_decode_loop.benchmark import write_json
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.workloads import sample_requests
from course.s06_kernels_graphs.engine import KernelEngineConfig

from .engine import Engine, SpeculativeConfig

REWRITE = [
    "Fix the spelling in this text and repeat it: 'The quick brown fox jumpd over the lazy dog. It was a sunny day "
    "and the fox was verry happy to be outside in the feilds.'",
    "Repeat this list exactly, one item per line: apples, bananas, cherries, dates, elderberries, figs, grapes.",
    "Rewrite this sentence in the past tense: 'I walk to the market, I buy fresh bread, and I go home to eat it "
    "with my family.'",
    "Copy this code and add a comment on top: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
]
SYSTEMS = {"off": None, "lookup k=2": SpeculativeConfig("lookup", 2), "lookup k=4": SpeculativeConfig("lookup", 4),
           "eagle k=2": SpeculativeConfig("eagle", 2), "eagle k=4": SpeculativeConfig("eagle", 4)}


# Engine features on and off (speculation off) on the chat workload, token budget 128 so that
# long prompts are chunked: each row changes one thing against the first (without chunking the
# budget must hold a whole prompt, so that row has 512).
FEATURES = {"all on (default)": {}, "no prefix caching": {"enable_prefix_caching": False},
            "no chunked prefill (budget 512: whole prompts)": {"enable_chunked_prefill": False,
                                                               "max_num_batched_tokens": 512},
            "stage 04's engine (no ModelRunner)": {"engine": "stage04"},
            "fused (merged QKV/gate-up)": {"fused": True}}


def make_engine(loaded, concurrency: int, budget: int, spec=None, engine: str = "final", **features):
    sizes = dict(num_blocks=1024, max_num_seqs=concurrency, max_num_batched_tokens=budget, record_steps=False)
    if engine == "stage04":
        from course.s04_continuous_batching.engine import EngineConfig
        from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
        return BatchingEngine(loaded.model, loaded.tokenizer, EngineConfig(**sizes), loaded.eos_token_ids)
    return Engine(loaded.model, loaded.tokenizer, KernelEngineConfig(**(sizes | features)), loaded.eos_token_ids, spec)


def serve(engine, prompts, max_output: int) -> dict:
    params = SamplingParams(max_new_tokens=max_output, temperature=0.0)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    s = getattr(engine, "spec_stats", None)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "acceptance_rate": s.acceptance_rate if s else 0.0,
            "mean_accepted_length": s.mean_accepted_length if s else 0.0, "outputs": [o.token_ids for o in outputs]}


def table(rows: list[dict], label: str, systems: dict, run) -> None:
    """Run each system, check it emits the first one's tokens, print and keep a row each."""
    base = None
    for name, settings in systems.items():
        r = run(settings)
        base = base or r
        assert r["outputs"] == base["outputs"], f"{name} changed the greedy output"
        row = {"label": label, "system": name, "vs_first": r["tok_s"] / base["tok_s"]} | \
            {k: v for k, v in r.items() if k != "outputs"}
        rows.append(row)
        print(f"{label:16s} {name:36s} {row['tok_s']:7.1f} tok/s  x{row['vs_first']:.2f}"
              f"  accepted {row['acceptance_rate']:.0%}  {row['mean_accepted_length']:.2f} tok/forward")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--sections", nargs="+", choices=["speculation", "features"], default=["speculation", "features"])
    p.add_argument("--json")
    args = p.parse_args(argv)
    loaded = load_model()
    tok = loaded.tokenizer
    chat = [r.prompt for r in sample_requests(tok, args.requests, seed=0, max_prompt_tokens=256)]
    workloads = {"chat": chat, "rewrite": (REWRITE * args.requests)[:args.requests]}
    rows = []
    for workload, texts in workloads.items() if "speculation" in args.sections else ():
        prompts = [encode_prompt(tok, t, chat=True) for t in texts]
        for concurrency in args.concurrency:
            table(rows, f"{workload} c={concurrency}", SYSTEMS,
                  lambda spec: serve(make_engine(loaded, concurrency, 512, spec), prompts, args.max_output))
    prompts = [encode_prompt(tok, t, chat=True) for t in workloads["chat"]]
    top = max(args.concurrency)
    if "features" in args.sections:
        table(rows, f"features c={top}", FEATURES,
              lambda features: serve(make_engine(loaded, top, 128, **features), prompts, args.max_output))
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
