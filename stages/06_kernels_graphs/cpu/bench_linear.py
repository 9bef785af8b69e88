"""The decode step's matmuls alone, every way this CPU can run them, side by side in one run.

    python -m course.s06_kernels_graphs.cpu.bench_linear [--rows 1 32 256] [--json out.json | --results]

One forward's linears of SmolLM2-135M (30 layers of q, k, v, o, gate, up, down, and the tied
lm_head), random weights of the real shapes, `rows` activation rows (1 = one decode token;
32 = a batch of decodes; 256 = a prefill chunk). Median of 10 after a warm-up.

  linear          torch's F.linear, stage 01's seven matmuls per layer
  merged          QKV and gate-up concatenated (fused_model.py): four per layer
  merged+split    each merged matmul as one bmm over P row blocks (split_linear.py)
  merged, oneDNN  each merged matmul by oneDNN's matmul (onednn.py: past 64 rows, where faster)
  bf16 / +split   the same in bfloat16 weights and activations (this CPU has AVX-512 BF16)
  int8 w-only     int8 weights, one scale per output row, bf16 activations
                  (torch._weight_int8pack_mm, the kernel torch's own int8 CPU path uses)

Reported: ms per forward, effective GB/s of weights read, and the ratio to `linear`. The
engine runs float32 unless asked: `--dtype bfloat16`, or int8 weights with `--quantization int8`
(int8_linear.py, which uses the int8 kernel for few rows only; final/bench/precision.py measures
speed and quality).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from course.s01_decode_loop.bench.measure import bench_cli, median_of

from .onednn import onednn_available, onednn_product
from .split_linear import split_matmul

LAYERS, HIDDEN, KV, INTER, VOCAB = 30, 576, 192, 1536, 49152
PER_LAYER = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]


def median_ms(fn, reps: int = 10) -> float:
    return 1e3 * median_of(fn, repeats=reps)


def weights(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(stage 01's matrices, the merged ones), lm_head last in both."""
    g = torch.Generator().manual_seed(seed)
    plain, merged = [], []
    for _ in range(LAYERS):
        q, k, v, o, gate, up, down = (torch.randn(n, kk, generator=g) * 0.02 for n, kk in PER_LAYER)
        plain += [q, k, v, o, gate, up, down]
        merged += [torch.cat([q, k, v]), o, torch.cat([gate, up]), down]
    lm_head = torch.randn(VOCAB, HIDDEN, generator=g) * 0.02
    return plain + [lm_head], merged + [lm_head]


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(1) / 127
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.to(torch.bfloat16)


def run(rows_list: list[int], parts: int) -> list[dict]:
    plain, merged = weights()
    merged_bf16 = [w.to(torch.bfloat16) for w in merged]
    merged_int8 = [quantize_rows(w) for w in merged]
    fp32_bytes = sum(w.numel() for w in merged) * 4
    results = []
    for m in rows_list:
        x = {HIDDEN: torch.randn(m, HIDDEN), INTER: torch.randn(m, INTER)}
        xb = {n: t.to(torch.bfloat16) for n, t in x.items()}
        ways = {
            "linear": (lambda: [F.linear(x[w.shape[1]], w) for w in plain], 4),
            "merged": (lambda: [F.linear(x[w.shape[1]], w) for w in merged], 4),
            f"merged+split{parts}": (lambda: [split_matmul(x[w.shape[1]], w, parts) for w in merged], 4),
            **({"merged, oneDNN": (lambda: [onednn_product(x[w.shape[1]], w) for w in merged], 4)}
               if onednn_available() else {}),
            "bf16 merged": (lambda: [F.linear(xb[w.shape[1]], w) for w in merged_bf16], 2),
            f"bf16 merged+split{parts}": (lambda: [split_matmul(xb[w.shape[1]], w, parts) for w in merged_bf16], 2),
            "int8 w-only": (lambda: [torch._weight_int8pack_mm(xb[q.shape[1]], q, s) for q, s in merged_int8], 1),
        }
        base = None
        for name, (fn, bytes_per_weight) in ways.items():
            ms = median_ms(fn)
            base = base or ms
            gbs = fp32_bytes / 4 * bytes_per_weight / (ms / 1e3) / 1e9
            results.append({"rows": m, "way": name, "ms": ms, "weight_gb_s": gbs, "speedup": base / ms})
            print(f"rows {m:>4} {name:<22} {ms:8.2f} ms  {gbs:5.1f} GB/s of weights  {base / ms:5.2f}x", flush=True)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--parts", type=int, default=None, help="row blocks of the split (default: torch's threads)")


def run_all(args) -> dict:
    parts = args.parts or torch.get_num_threads()
    return {"kernels": "cpu", "parts": parts, "rows": run(args.rows, parts)}


main = bench_cli(__doc__, add_args, run_all, lambda result: None, module="course.s06_kernels_graphs.cpu.bench_linear")


if __name__ == "__main__":
    main()
