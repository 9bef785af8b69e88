"""What one full garbage collection costs the server, with its start-up heap walked and frozen.

    python -m course.final.bench.gc_pause [--repeats 5] [--results]

The server as `python -m course.final serve` builds it (the default model, the CPU defaults);
then `--repeats` full collections (`gc.collect()`, the pause every thread waits out when Python
runs its oldest generation), median and worst; then the same after `freeze_startup_heap()`
(final/heap.py), side by side in one run.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

from course.s01_decode_loop.bench.measure import bench_cli


def collection_ms(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def run(args: argparse.Namespace) -> dict:
    from ..cli import build_server, make_parser
    from ..launch.heap import freeze_startup_heap

    server = build_server(make_parser()[0].parse_args(["serve"]))  # held to the end, as when serving
    tracked = len(gc.get_objects())
    walked = collection_ms(args.repeats)
    frozen_count = freeze_startup_heap()
    frozen = collection_ms(args.repeats)
    row = lambda ms: {"median_ms": statistics.median(ms), "max_ms": max(ms)}  # noqa: E731
    return {"tracked_objects": tracked, "frozen_objects": frozen_count, "repeats": args.repeats,
            "walked": row(walked), "frozen": row(frozen),
            "ratio": statistics.median(walked) / max(statistics.median(frozen), 1e-3), "engine": type(server[0]).__name__}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5)


def report(result: dict) -> None:
    w, f = result["walked"], result["frozen"]
    print(f"{result['tracked_objects']:,} objects after start-up; a full collection: {w['median_ms']:.1f} ms "
          f"(worst {w['max_ms']:.1f}), with them frozen {f['median_ms']:.2f} ms (worst {f['max_ms']:.2f})")


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.gc_pause")

if __name__ == "__main__":
    main()
