"""Per-row sampling vs the batched sampler, side by side in one run.

    python -m course.s04_continuous_batching.bench.bench_sampler [--batch 1 8 32 64] [--vocab 49152]
                                                            [--reps 20] [--device cpu] [--threads 2 1]
                                                            [--results | --json out.json]

For each batch size B: B rows of random logits over SmolLM2's vocabulary, half sampled
(temperature 0.8 with top-p 0.95, every other one with top-k 50 as well, each with its own seeded
generator), half greedy. Per row is stage 01's way, one request at a time: one
`Sequence.sample` call (and one `int(argmax)` host sync) per row. Batched is one `sample_batch`
call. Both skip appending the token (the same work either way). The two alternate, rep by rep,
after one warm-up round; the ratio is the median of the per-rep ratios. On a GPU the device is
synchronised around every timing.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from course.s01_decode_loop.bench.measure import bench_cli, timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import byte_tokenizer

from ..batch_sampler import sample_batch


def mixed_rows(batch: int) -> list[SamplingParams]:
    """Half sampled (B=1: one sampled row), half greedy; the sampled rows alternate top-p + top-k
    with top-p alone."""
    return [SamplingParams(temperature=0) if i % 2 else
            SamplingParams(temperature=0.8, top_p=0.95, top_k=50 if i % 4 == 0 else 0, seed=i)
            for i in range(batch)]


def time_side_by_side(per_row, batched, reps: int, device: torch.device) -> tuple[float, float, float]:
    """Median seconds of each, and the median of the per-rep ratios. The two alternate within
    every rep, so a busy (shared) machine slows both alike."""
    per_row(), batched()  # warm-up: generators made, kernels and allocator ready
    pairs = [(timed(per_row, device=device), timed(batched, device=device)) for _ in range(reps)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(a / b for a, b in pairs))


def row_name(row: dict) -> str:
    """A row's name in the results, from its own fields: `threads=2/batch=32`."""
    return f"threads={row['threads']}/batch={row['batch']}"


def run(batches: list[int], vocab: int, reps: int, device: str, threads: list[int]) -> dict:
    device = torch.device(device)
    tok = byte_tokenizer()  # the sequences are never detokenized here; any tokenizer will do
    g = torch.Generator().manual_seed(0)
    rows = []
    for n_threads, batch in ((n, b) for n in threads for b in batches):
        torch.set_num_threads(n_threads)
        seqs = [Sequence([1, 2, 3], sp, tok) for sp in mixed_rows(batch)]
        logits = (torch.randn(batch, vocab, generator=g) * 3).to(device)
        per_row, batched, ratio = time_side_by_side(
            lambda: [seq.sample(logits[i]) for i, seq in enumerate(seqs)], lambda: sample_batch(logits, seqs),
            reps, device)
        rows.append({"name": row_name({"threads": n_threads, "batch": batch}), "threads": n_threads, "batch": batch,
                     "per_row_ms": per_row * 1e3, "batched_ms": batched * 1e3, "speedup": ratio})
    return {"device": str(device), "vocab": vocab, "reps": reps, "rows": rows}


def print_report(r: dict) -> None:
    print(f"{r.get('device', 'cpu')}; vocab {r['vocab']}; half greedy, half sampled; median of {r['reps']}")
    print(f"{'threads':>7} {'B':>4} {'per row ms':>11} {'batched ms':>11} {'per row / batched':>18}")
    for row in r["rows"]:
        print(f"{row['threads']:>7} {row['batch']:>4} {row['per_row_ms']:11.2f} {row['batched_ms']:11.2f} "
              f"{row['speedup']:17.2f}x")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--vocab", type=int, default=49152)  # SmolLM2's
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()],
                   help="torch CPU thread counts to measure, in turn (default: torch's own)")


main = bench_cli(__doc__, add_args, lambda args: run(args.batch, args.vocab, args.reps, args.device, args.threads),
                 print_report, module="course.s04_continuous_batching.bench.bench_sampler")


if __name__ == "__main__":
    main()
