"""Steps that are not all decodes, against a decode step: do they replay a graph, and what do they cost?

    python -m course.s06_kernels_graphs.bench.mixed_step [--model 1b-random] [--context 1024] [--dry-run]
                                                         [--kernels gpu|lesson] [--json out.json | --results]

The engine is built as bench/benchmark.py builds its best GPU setting (Triton kernels, the gpu
room's by default, fused ops, CUDA graphs), on Llama-3.2-1B's shape with random weights, and its ModelRunner is driven
with hand-made steps over 64 sequences of `context` cached tokens each (a random pool):

    decode   64 decodes
    mixed    4 prefill chunks of 64 tokens (their sequences' last 64 positions) + 60 decodes
    verify   64 sequences x 4 tokens: a speculative verification of 3 drafts each

Each step runs once first (the runner captures its graphs, Triton compiles), then is timed as the
median of wall-clock steps with the device synchronised: a step's host work is part of its cost.
`graphed` records whether the runner replayed a graph for it; on a GPU the same steps are then timed
with the graphs switched off (eager), for scale. The goal: mixed within 1.3x of decode, both graphed.
`--dry-run`: a tiny model on the CPU (Triton through the interpreter, the graphs' eager
stand-in), 4 sequences: the plumbing of gpu_check.sh, with figures that mean nothing.
"""
from __future__ import annotations

import argparse
import traceback

import torch

from course.s01_decode_loop.bench.measure import bench_cli, median_of, timed
from course.s01_decode_loop.testing import byte_tokenizer

from .. import gpu, mixed_graphs
from ..engine import KernelEngineConfig, LLMEngine
from .benchmark import BLOCK, load


def build_engine(model, seqs: int, context: int, max_tokens: int, kernels: str = "gpu") -> LLMEngine:
    """benchmark.py's best GPU setting, with room for `seqs` sequences of `context` tokens."""
    pages = -(-context // BLOCK)
    config = KernelEngineConfig(num_blocks=seqs * pages + 8, block_size=BLOCK, max_num_seqs=seqs,
                                max_num_batched_tokens=max_tokens, fused=True, cuda_graphs=True,
                                attention_backend="triton", triton_kernels=kernels)
    assert context <= config.graph_max_seq_len, "past the graphs' longest sequence every step runs eagerly"
    return LLMEngine(model, byte_tokenizer(), config)


def fill_pool(cache) -> None:
    """The same random pool every time (attention reads real numbers, never zeros): each step's
    first run starts from it, so the graphed and the eager run of a step compute the same thing."""
    g = torch.Generator(cache.k.device).manual_seed(1)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)


def steps(seqs: int, context: int, chunks: int, chunk_tokens: int, verify_tokens: int, vocab: int) -> dict:
    """name -> (token_ids, seqs as (num_cached, num_new, block_table), sample_rows)."""
    pages = -(-context // BLOCK)
    table = [list(range(b * pages, (b + 1) * pages)) for b in range(seqs)]
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731

    def step(new_per_seq: list[int], sample_last_only: bool):
        layout = [(context - n, n, table[b]) for b, n in enumerate(new_per_seq)]
        rows, start = [], 0
        for n in new_per_seq:
            rows += [start + n - 1] if sample_last_only else list(range(start, start + n))
            start += n
        return ids(start), layout, rows

    return {"decode": step([1] * seqs, True),
            "mixed": step([chunk_tokens] * chunks + [1] * (seqs - chunks), True),
            "verify": step([verify_tokens] * seqs, False)}


def time_steps(runner, work: dict, device, reps: int, label: str, cache) -> tuple[list[dict], dict]:
    """Each step run once (its graphs captured, kernels compiled: the warm-up), then the median of
    `reps` timed runs; reps 0 keeps the first run's time (the dry run: the plumbing only). A step
    that fails leaves an "error" in its row and the others still run. Returns (rows, each step's
    logits from its first run)."""
    rows, logits = [], {}
    for name, (token_ids, layout, sample_rows) in work.items():
        row = {"step": name, "mode": label, "tokens": len(token_ids), "seqs": len(layout),
               "sampled_rows": len(sample_rows)}
        rows.append(row)
        try:
            outs = []
            fill_pool(cache)
            first = timed(lambda: outs.append(runner.run(token_ids, layout, sample_rows)), device=device)
            out = outs[0]
            assert out.logits.shape[0] == len(sample_rows) and torch.isfinite(out.logits).all(), "bad logits"
            logits[name] = out.logits.float().cpu().clone()  # a replay's logits live in its static buffers
            seconds = median_of(runner.run, token_ids, layout, sample_rows, repeats=reps, device=device) if reps else first
            row |= {"graphed": bool(out.graphed), "step_ms": seconds * 1e3}
            print(f"{label:6s} {name:6s} {len(token_ids):4d} tokens {len(layout):3d} seqs: {seconds * 1e3:8.2f} ms"
                  f"  graphed={out.graphed}")
        except Exception as e:  # noqa: BLE001 - one step's failure must not lose the others' figures
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:400]
    return rows, logits


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="tiny model on the CPU through the interpreter: the plumbing only, figures mean nothing")
    p.add_argument("--model", default="1b-random", help="1b-random or 135m-random (random weights in their shape)")
    p.add_argument("--context", type=int, default=1024, help="cached tokens per sequence")
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--chunks", type=int, default=4, help="prefill chunks in the mixed step")
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--verify-tokens", type=int, default=4)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--kernels", choices=["gpu", "lesson"], default="gpu", help="the Triton backend's kernel set")


@torch.no_grad()
def run(args) -> dict:
    gpu.register()  # the gpu room's kernel set
    mixed_graphs.register()  # token buckets: the mixed and verify steps replay graphs
    dry = args.dry_run or not torch.cuda.is_available()
    if dry:  # the same steps, scaled down
        args.model, args.context, args.seqs, args.chunks, args.chunk_tokens, args.reps = "tiny", 32, 4, 2, 4, 0
    device = torch.device("cpu" if dry else "cuda")
    model, _ = load(args.model, device, torch.float32 if dry else torch.bfloat16)
    work = steps(args.seqs, args.context, args.chunks, args.chunk_tokens, args.verify_tokens, model.config.vocab_size)
    most = max(len(ids) for ids, _, _ in work.values())
    max_tokens = max(16, 1 << (most - 1).bit_length())  # the token bucket the largest step needs
    engine = build_engine(model, args.seqs, args.context, max_tokens, args.kernels)
    runner = engine.runner
    rows, graphed_logits = time_steps(runner, work, device, args.reps, "graphs", engine.cache)
    if not dry:  # for scale: the same steps with the graphs switched off
        graphs, runner.graphs = runner.graphs, None
        eager_rows, eager_logits = time_steps(runner, work, device, args.reps, "eager", engine.cache)
        runner.graphs = graphs
        rows += eager_rows
        for row in rows[:len(work)]:  # a replay computes what the eager step computes (bf16: to ~1e-2)
            name = row["step"]
            if name in graphed_logits and name in eager_logits:
                g, e = graphed_logits[name], eager_logits[name]
                row["logits_rel_diff_vs_eager"] = ((g - e).norm() / e.norm()).item()
    ms = {r["step"]: r.get("step_ms") for r in rows if r["mode"] == "graphs"}
    ratio = lambda step: ms[step] / ms["decode"] if ms.get(step) and ms.get("decode") else None  # noqa: E731
    return {"dry_run": dry, "model": args.model, "kernels": args.kernels, "context": args.context, "seqs": args.seqs, "chunks": args.chunks,
            "chunk_tokens": args.chunk_tokens, "verify_tokens": args.verify_tokens, "max_num_batched_tokens": max_tokens,
            "rows": rows, "mixed_vs_decode": ratio("mixed"), "verify_vs_decode": ratio("verify"),
            "graphed": {r["step"]: r.get("graphed", False) for r in rows if r["mode"] == "graphs"}}


def report(result: dict) -> None:
    if result["dry_run"]:
        print("# dry run on the CPU: the figures mean nothing")
    ratio = lambda x: f"x{x:.2f}" if x is not None else "(failed)"  # noqa: E731
    print(f"{result['model']}, {result['seqs']} sequences at {result['context']} tokens: mixed step "
          f"{ratio(result['mixed_vs_decode'])} of a decode step, verification {ratio(result['verify_vs_decode'])};"
          f" graphed: {result['graphed']}")


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.bench.mixed_step")


if __name__ == "__main__":
    main()
