"""The AVX2 hosts' matrix products, measured on this machine, side by side in one run.

    python -m course.s06_kernels_graphs.cpu.bench_avx2 [--rows 1 4 16] [--json out.json | --results]

Zen 3 hosts have AVX2 + FMA and no AVX-512. layer.c is compiled here three ways, each a library
of its own (cpu/native.py, `-march=` and a define):

  plain       -march=haswell -DPLAIN_LOOPS: the plain-C loops, as gcc vectorizes them alone
  avx2        -march=haswell: layer.c's 8-wide register blocks; int8 weights through int8.c's
              vpmaddwd integer path (activations rounded to int16, as the VNNI path does)
  native      -march=native: this CPU's own build (AVX-512 and VNNI here), for reference

and each runs one decode step's products of SmolLM2-135M (30 layers of merged QKV, o, merged
gate-up and down, and the tied lm_head; random weights of the real shapes, 540 MB in float32) at `rows` activation
rows, float32 and int8 weights. Median of 5 after a warm-up, on torch's thread count. Reported:
ms per step and the ratio plain / avx2 (what the AVX2 kernels buy on a Zen 3 host, as far as
this CPU, running its instructions, can say: its caches and clocks are not Zen 3's).
"""
from __future__ import annotations

import ctypes

import torch

from course.s01_decode_loop.bench.measure import bench_cli, median_of

from . import layer as cpu_layer
from . import native
from .int8_linear import quantize_rows

HIDDEN, QKV, INTER, VOCAB, LAYERS = 576, 960, 1536, 49152, 30
SHAPES = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # per layer: (n, k)
BUILDS = {"plain": ["-march=haswell", "-DPLAIN_LOOPS"], "avx2": ["-march=haswell"], "native": []}


def library(flags: list[str]) -> ctypes.CDLL:
    lib = native.load(cpu_layer.SOURCE, cpu_layer.FLAGS + flags)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.product_f32.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.product_i8_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    return lib


def step(lib, weights, rows: int, int8: bool, threads: int):
    """A function running one decode step's products through `lib`."""
    xs = {k: torch.randn(rows, k) for k in (HIDDEN, INTER)}
    outs = {n: torch.empty(rows, n) for n, _ in [*SHAPES, (VOCAB, HIDDEN)]}

    def run():
        for (n, k), w in weights:
            x, y = xs[k], outs[n]
            if int8:
                q, scale = w
                lib.product_i8_f32(x.data_ptr(), q.data_ptr(), scale.data_ptr(), y.data_ptr(), rows, n, k, threads)
            else:
                lib.product_f32(x.data_ptr(), w.data_ptr(), y.data_ptr(), rows, n, k, threads)
    return run


def run_all(args) -> dict:
    g = torch.Generator().manual_seed(0)
    shapes = SHAPES * LAYERS + [(VOCAB, HIDDEN)]
    floats = [torch.randn(*shape, generator=g) * 0.02 for shape in shapes]  # each layer its own: read from memory
    weights = {False: list(zip(shapes, floats)), True: [(s, quantize_rows(w)) for s, w in zip(shapes, floats)]}
    threads = torch.get_num_threads()
    libs = {name: library(flags) for name, flags in BUILDS.items()}
    rows_out = []
    for int8 in (False, True):
        for rows in args.rows:
            ms = {name: 1e3 * median_of(step(lib, weights[int8], rows, int8, threads), repeats=5)
                  for name, lib in libs.items()}
            kind = "int8" if int8 else "float32"
            rows_out.append({"name": f"{kind}/{rows} rows", "weights": kind, "rows": rows, "ms": ms,
                             "avx2_over_plain": ms["plain"] / ms["avx2"]})
    return {"threads": threads, "builds": BUILDS, "rows": rows_out}


def report(result: dict) -> None:
    print(f"{'weights':>8} {'rows':>5} {'plain ms':>9} {'avx2 ms':>8} {'native ms':>9} {'plain/avx2':>10}")
    for r in result["rows"]:
        ms = r["ms"]
        print(f"{r['weights']:>8} {r['rows']:>5} {ms['plain']:9.2f} {ms['avx2']:8.2f} {ms['native']:9.2f} "
              f"{r['avx2_over_plain']:9.2f}x")


def add_args(p) -> None:
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])


main = bench_cli(__doc__, add_args, run_all, report, module="course.s06_kernels_graphs.cpu.bench_avx2")

if __name__ == "__main__":
    main()
