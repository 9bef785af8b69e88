"""Does speculation pay through the server? One request at a time, as a chat user sends them.

    python -m course.final.bench.speculation [--prompts 4] [--max-tokens 128] [--temperature 0]
        [--system "off|" --system "eagle k=4, fixed|--speculative-method eagle --speculative-policy fixed" ...]

Each system is the server's own engine, built by `python -m course.final serve`'s code from the
flags given (`build_server`: the CPU defaults, the KV pool, the warm-up), driven in process one
request at a time, so the figure is decode speed without HTTP in it. Every system answers the
same held-out chat prompts (stage 05's, never trained on); greedy systems must give the first
system's tokens. Printed per system: output tok/s and its ratio to the first, tokens per
verifying forward, the share of the time spent drafting, and the draft policy's measured costs.
On another host's instruction set, set COURSE_CPU_ARCH=haswell ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2 (stage 06's cpu/native.py) and say so with the figures.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s05_speculative.training.eagle_data import heldout_prompts

SYSTEMS = ["off|", "eagle k=4, fixed|--speculative-method eagle --speculative-policy fixed",
           "eagle k=4, cost policy|--speculative-method eagle",
           "eagle tree k=4, cost policy|--speculative-method eagle --speculative-tree"]


def engine_for(flags: str):
    from ..cli import build_server, make_parser

    args = make_parser()[0].parse_args(["serve", *flags.split()])
    args.chat_template = args.chat_template and Path(args.chat_template).read_text()  # as `serve` reads it
    return build_server(args)[0].engine


def serve_one_at_a_time(llm, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Each prompt alone, in turn; the seconds spent in the drafter's proposals counted apart."""
    drafting = [0.0]

    def timed(propose):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                drafting[0] += time.perf_counter() - start
        return call
    for name in ("propose", "propose_tree"):  # chains and trees
        if llm.source is not None and hasattr(llm.source, name):
            setattr(llm.source, name, timed(getattr(llm.source, name)))
    llm.generate([prompts[0]], SamplingParams(max_new_tokens=8, temperature=0.0))  # warm
    llm.spec_stats.__init__()
    outputs, start = [], time.perf_counter()
    for prompt in prompts:
        outputs.append(llm.generate([prompt], params)[0].token_ids)
    wall = time.perf_counter() - start
    tokens = sum(len(o) for o in outputs)
    stats = llm.spec_stats
    row = {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "drafting_share": drafting[0] / wall,
           "proposed": stats.proposed, "accepted": stats.accepted,
           "tokens_per_verifying_forward": stats.mean_accepted_length, "outputs": outputs}
    if llm.draft_policy is not None:
        row["draft_policy"] = llm.draft_policy.describe()
    return row


def run(args: argparse.Namespace) -> dict:
    rows, first = [], None
    for system in args.system or SYSTEMS:
        name, _, flags = system.partition("|")
        llm = engine_for(flags)
        prompts = [encode_prompt(llm.tokenizer, p, chat=True) for p in heldout_prompts(llm.tokenizer, args.prompts)]
        # sampled: unseeded, as the cost policy decodes a seeded sampled request plainly (engine.py)
        params = SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature,
                                seed=1 if args.temperature == 0 else None)
        row = {"name": name, "flags": flags} | serve_one_at_a_time(llm, prompts, params)
        first = first or row
        row["vs_first"] = row["tok_s"] / first["tok_s"]
        if args.temperature == 0:
            assert row["outputs"] == first["outputs"], f"{name} changed the greedy answers"
        rows.append({k: v for k, v in row.items() if k != "outputs"})
        r = rows[-1]
        print(f"{name:32s} {r['tok_s']:6.1f} tok/s  x{r['vs_first']:.2f}  {r['tokens_per_verifying_forward']:.2f} "
              f"tok/forward  drafting {r['drafting_share']:.0%}", flush=True)
    isa = {k: os.environ[k] for k in ("COURSE_CPU_ARCH", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if k in os.environ}
    return {"prompts": args.prompts, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "instruction_set": isa or "this machine's own", "rows": rows}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=4, help="held-out chat prompts, answered one at a time")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--system", action="append", metavar="NAME|FLAGS",
                   help="a system: its name and the `serve` flags it runs with (repeatable; the first is the baseline)")


def report(result: dict) -> None:
    print(f"{len(result['rows'])} systems, {result['prompts']} prompts, {result['max_tokens']} tokens, "
          f"temperature {result['temperature']}")


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.speculation")

if __name__ == "__main__":
    main()
