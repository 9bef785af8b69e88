"""The ceilings a kernel is judged against, measured on the card itself in the same run.

    python -m course.s06_kernels_graphs.bench.ceilings [--dry-run] [--json out.json | --results]

A datasheet's bandwidth and FLOP rate are leads, not ceilings: what a card really sustains is
lower, and differs from card to card. So each is measured here, where the kernels run:

  copy bandwidth   a device-to-device copy of a 1 GiB buffer; bytes read + bytes written / time
  read bandwidth   bytes / time of a pass that only reads: torch's sum over the buffer, and a
                   Triton kernel whose programs each sum a slice and write one number; the faster
                   of the two is the ceiling of a decode kernel, which reads K/V and writes little
  bf16 GEMM        2 n^3 / time of an n x n x n matmul (n = 8,192) on random data (zeros run
                   faster than real data do)

Every figure is the median of replays of a CUDA graph holding several launches (graph_time),
so launch gaps stay out; buffers are far larger than the L2 cache. `--dry-run` runs the same
code on the CPU at tiny sizes (the Triton kernel through the interpreter): it proves the
plumbing of the device script (gpu_check.sh), and its figures mean nothing.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from course.s01_decode_loop.bench.measure import bench_cli, median_of

GIB = 1 << 30


def graph_time(fns, launches: int = 10, reps: int = 5) -> float:
    """Median seconds per launch. `fns` is a callable, or a list of them cycled through (the same
    work on different buffers, so that data small enough for the L2 cache is not timed from it).
    On CUDA the launches are captured in one graph and its replays timed with events; elsewhere
    the harness's median_of times plain calls."""
    fns = fns if isinstance(fns, (list, tuple)) else [fns]
    if not torch.cuda.is_available():
        cycle = itertools.cycle(fns)
        return median_of(lambda: next(cycle)(), repeats=reps, warmup=0)  # the caller has run it once
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile, autotune and allocate outside the capture
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    launches = max(launches, len(fns))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fns[i % len(fns)]()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / launches)
    return sorted(times)[len(times) // 2]


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """Program p sums elements [p * BLOCK * TILES, (p + 1) * BLOCK * TILES): TILES independent
    wide loads in flight, one store."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * TILES
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(TILES):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def triton_read(x: torch.Tensor, out: torch.Tensor, block: int, tiles: int) -> torch.Tensor:
    _read_kernel[(out.numel(),)](x, out, x.numel(), BLOCK=block, TILES=tiles)
    return out


def measure(nbytes: int, gemm_n: int, dtype, device, block: int = 4096, tiles: int = 8) -> dict:
    """The three ceilings; `nbytes` the size of each buffer, `gemm_n` the matmul's side."""
    src = torch.randn(nbytes // dtype.itemsize, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = graph_time(lambda: dst.copy_(src), launches=5)
    sum_s = graph_time(lambda: src.sum(dtype=torch.float32), launches=5)
    partial = torch.empty(triton.cdiv(src.numel(), block * tiles), device=device, dtype=torch.float32)
    read_s = graph_time(lambda: triton_read(src, partial, block, tiles), launches=5)
    read_ok = bool(torch.allclose(partial.sum(), src.float().sum(), rtol=1e-3, atol=1e-2 * src.numel() ** 0.5))
    del src, dst
    a = torch.randn(gemm_n, gemm_n, device=device, dtype=dtype)
    b = torch.randn(gemm_n, gemm_n, device=device, dtype=dtype)
    gemm_s = graph_time(lambda: a @ b, launches=5)
    result = {"copy_GBps": 2 * nbytes / copy_s / 1e9,
              "read_GBps": nbytes / (min(sum_s, read_s) if read_ok else sum_s) / 1e9,
              "read_torch_sum_GBps": nbytes / sum_s / 1e9, "read_triton_GBps": nbytes / read_s / 1e9,
              "read_triton_sum_ok": read_ok,
              "gemm_TFLOPs": 2 * gemm_n ** 3 / gemm_s / 1e12,
              "buffer_bytes": nbytes, "gemm_n": gemm_n, "dtype": str(dtype)}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        result["device"] = {"name": props.name, "sms": props.multi_processor_count,
                            "memory_GiB": props.total_memory / GIB,
                            "l2_bytes": getattr(props, "L2_cache_size", None)}
    return result


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: the plumbing only, figures mean nothing")
    p.add_argument("--gib", type=float, default=1.0, help="buffer size for the bandwidths (GiB)")
    p.add_argument("--gemm-n", type=int, default=8192)


def run(args) -> dict:
    dry = args.dry_run or not torch.cuda.is_available()
    if dry:
        result = measure(1 << 20, 128, torch.float32, "cpu", block=1024, tiles=4)
    else:
        result = measure(int(args.gib * GIB), args.gemm_n, torch.bfloat16, "cuda")
    return {**result, "dry_run": dry}


def report(result: dict) -> None:
    where = "dry run on the CPU (figures mean nothing)" if result["dry_run"] else result["device"]["name"]
    print(f"ceilings, {where}: copy {result['copy_GBps']:.0f} GB/s (read + write), read {result['read_GBps']:.0f} GB/s"
          f" (torch sum {result['read_torch_sum_GBps']:.0f}, Triton {result['read_triton_GBps']:.0f}),"
          f" {result['dtype']} GEMM n={result['gemm_n']}: {result['gemm_TFLOPs']:.1f} TFLOP/s")


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.bench.ceilings")


if __name__ == "__main__":
    main()
