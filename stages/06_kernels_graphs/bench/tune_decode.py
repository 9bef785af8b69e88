"""The decode kernel's tile and launch knobs, swept on a GPU: keys per tile, warps, splits.

    python -m course.s06_kernels_graphs.bench.tune_decode [--json out.json | --results]

For each shape (batch, context), every setting is first checked against the PyTorch reference,
then timed as 20 launches captured in one CUDA graph and replayed (so Python's launch cost,
tens of microseconds a call, is not what is measured). Printed per shape: the default
setting (BLOCK_N keys, Triton's warps, choose_num_splits) and the best, as GB/s of the bytes the
kernel must move against the measured copy bandwidth. Without CUDA it says so and stops: the
interpreter's timings mean nothing (the knobs' correctness is tested on the CPU in
tests/test_decode_attention.py).
"""
from __future__ import annotations

import argparse
import itertools

import torch

from course.s01_decode_loop.bench.measure import bench_cli

from ..decode_attention import BLOCK_N, choose_num_splits, paged_decode_attention
from .ceilings import graph_time
from .roofline import copy_bandwidth
from .testing import make_paged_case, reference_attention
from .roofline import decode_pool

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 64, 16  # Llama-3.2-1B's attention shape, as bench_kernels
SHAPES = [(1, 2048), (1, 8192), (8, 2048), (32, 2048), (64, 2048), (64, 8192)]


def sweep(dtype=torch.bfloat16) -> list[dict]:
    dev = torch.device("cuda")
    roof = copy_bandwidth(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {roof / 1e9:.0f} GB/s, {sms} SMs")
    rows = []
    for batch, context in SHAPES:
        q, k, v, tables, lens, out, nbytes = decode_pool(batch, context, HEADS, KV_HEADS, HEAD_DIM, PAGE, dtype,
                                                        dev, shuffle=True)
        nb = tables.shape[1]
        default_splits = choose_num_splits(batch, KV_HEADS, nb, sms)
        split_choices = sorted({1, 2, 4, 8, 16, default_splits})
        results = []
        for block_n, warps, splits in itertools.product((16, 32, 64, 128), (None, 4, 8), split_choices):
            # each setting is first checked on a small case (random lengths, scattered pages)
            if not _correct(block_n, warps, splits, dtype):
                print(f"  WRONG: block_n={block_n} warps={warps} splits={splits}")
                continue
            t = graph_time(lambda: paged_decode_attention(q, k, v, tables, lens, num_splits=splits, out=out,
                                                          block_n=block_n, num_warps=warps))
            results.append({"name": f"B={batch} L={context} block_n={block_n} warps={warps or 0} splits={splits}",
                            "batch": batch, "context": context, "block_n": block_n, "num_warps": warps or 0,
                            "splits": splits, "us": t * 1e6, "GBps": nbytes / t / 1e9,
                            "pct_of_copy": 100 * nbytes / t / roof,
                            "default": block_n == BLOCK_N and warps is None and splits == default_splits})
            print(f"  B={batch} L={context} block_n={block_n} warps={warps or '-'} splits={splits}: {t * 1e6:.1f} us")
        rows += results
        default = next(r for r in results if r["default"])
        best = min(results, key=lambda r: r["us"])
        for label, r in (("default", default), ("best", best)):
            print(f"B={batch:3d} L={context:5d} {label:8s} block_n={r['block_n']:3d} warps={r['num_warps'] or '-':>2}"
                  f" splits={r['splits']:2d} {r['us']:8.1f} us {r['GBps']:6.0f} GB/s ({r['pct_of_copy']:4.1f}%)")
    return rows


_checked: dict = {}


def _correct(block_n, warps, splits, dtype) -> bool:
    key = (block_n, warps, splits)
    if key not in _checked:
        case = make_paged_case([1, 77, 513, 1000], [1] * 4, num_heads=HEADS, num_kv_heads=KV_HEADS,
                               head_dim=HEAD_DIM, block_size=PAGE, dtype=dtype, device="cuda")
        got = paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                     num_splits=splits, block_n=block_n, num_warps=warps)
        want = reference_attention(case.cpu())
        _checked[key] = bool(torch.allclose(got.float().cpu(), want, atol=3e-2, rtol=3e-2))
    return _checked[key]


def add_args(p: argparse.ArgumentParser) -> None:
    pass


def run(args) -> dict:
    if not torch.cuda.is_available():
        print("# no CUDA: nothing to tune (the interpreter's timings mean nothing)")
        return {"kernels": "lesson", "rows": []}
    return {"kernels": "lesson", "rows": sweep()}


main = bench_cli(__doc__, add_args, run, lambda result: None, module="course.s06_kernels_graphs.bench.tune_decode")


if __name__ == "__main__":
    main()
