"""Plot serving-benchmark results: latency and throughput against the request rate.

    python -m course.final.bench.plot_serving r0.5.json r1.json r2.json --out serving.png

Each JSON is one `python -m course.final.bench.serving --json` run; the runs are sorted by their request rate.
"""
from __future__ import annotations

import argparse
import json


def load_summaries(paths: list[str]) -> list[dict]:
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f)["summary"])
    return sorted(runs, key=lambda s: s["request_rate"])


def plot(summaries: list[dict], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rates = [s["request_rate"] for s in summaries]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(10, 4))
    for key, style in (("ttft", "o-"), ("tpot", "s-")):
        for q, alpha in (("p50", 1.0), ("p99", 0.5)):
            lat.plot(rates, [s[f"{q}_{key}_s"] * 1e3 for s in summaries], style, alpha=alpha,
                     label=f"{key.upper()} {q}")
    lat.set(xlabel="request rate (req/s)", ylabel="ms", yscale="log", title="latency")
    lat.legend()
    thr.plot(rates, [s["output_throughput"] for s in summaries], "o-")
    thr.set(xlabel="request rate (req/s)", ylabel="output tokens/s", title="throughput")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m course.final.bench.plot_serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bench.serving --json files")
    p.add_argument("--out", default="serving.png")
    args = p.parse_args(argv)
    plot(load_summaries(args.results), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
