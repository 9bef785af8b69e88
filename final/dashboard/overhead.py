"""What an open page costs the engine, measured side by side on one server in one run.

    python -m course.final serve &
    python -m course.final.bench.serving --request-rate inf --num-requests 40 --dashboard-watchers 1

Each round sends the same load twice: with no page open, then with N pages open (each reading
/dashboard/events as a browser does). It reports, page closed and open, the output tok/s and the
client's p50 gap between tokens (one decode step per token: the step time a client sees), the
ratio open/closed of each (median over the rounds), the step time the dashboard measured while
open, and the share of the engine thread's time its snapshots took (each snapshot reports the
previous one's cost: `series.snapshot_ms`). Run it on a quiet machine: the two loads differ only by the page.
"""
from __future__ import annotations

import asyncio
import json
import statistics

import httpx

from ..bench.serving import run


async def read_events(http: httpx.AsyncClient, series: list[dict]) -> None:
    """One open page: read every snapshot until cancelled."""
    async with http.stream("GET", "/dashboard/events") as r:
        if r.status_code != 200:
            raise RuntimeError(f"/dashboard/events answered {r.status_code}: is the server run with --no-dashboard?")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                series.append(json.loads(line[6:])["series"])


async def with_pages_open(base_url: str, watchers: int, load):
    """`await load()` while `watchers` pages read the event stream; (its result, their series points)."""
    series: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(None, connect=10)) as http:
        pages = [asyncio.create_task(read_events(http, series)) for _ in range(watchers)]
        await asyncio.sleep(0.5)  # the streams are open and the step clock installed
        for page in pages:
            if page.done():
                page.result()  # raises what stopped it
        try:
            return await load(), series
        finally:
            for page in pages:
                page.cancel()
            await asyncio.gather(*pages, return_exceptions=True)


async def side_by_side(base_url: str, requests: list[tuple[str, int]], rate: float, watchers: int = 1,
                       rounds: int = 2, **run_options) -> dict:
    """`rounds` x (the load with the page closed, then open); the summaries and their ratios."""
    out = []
    for _ in range(rounds):
        closed = (await run(base_url, requests, rate, **run_options))["summary"]
        opened, series = await with_pages_open(base_url, watchers,
                                               lambda: run(base_url, requests, rate, **run_options))
        steps = [p["step_ms"] for p in series if p["step_ms"] is not None]
        built_ms = sum(p.get("snapshot_ms", 0.0) for p in series)  # the engine thread's time on snapshots
        out.append({"closed": closed, "open": opened["summary"], "snapshots": len(series),
                    "dashboard_step_ms": statistics.mean(steps) if steps else None,
                    "snapshot_share": built_ms / 1e3 / opened["summary"]["duration_s"]})

    def ratio(key: str) -> float | None:
        pairs = [(r["open"][key], r["closed"][key]) for r in out if r["open"][key] and r["closed"][key]]
        return statistics.median(o / c for o, c in pairs) if pairs else None
    return {"watchers": watchers, "rounds": out,
            "overhead": {"output_throughput_open_over_closed": ratio("output_throughput"),
                         "p50_itl_open_over_closed": ratio("p50_itl_s"),
                         "snapshot_share": statistics.median(r["snapshot_share"] for r in out)}}


def print_overhead(result: dict) -> None:
    print(f"the dashboard's cost: {result['watchers']} page(s) open vs closed, same load, same server")
    for i, r in enumerate(result["rounds"]):
        for name in ("closed", "open"):
            s = r[name]
            itl = f"{s['p50_itl_s'] * 1e3:.1f}" if s["p50_itl_s"] is not None else "-"
            print(f"  round {i} page {name:6}: {s['output_throughput']:8.1f} output tok/s, p50 gap {itl} ms, "
                  f"{s['failed']} failed")
        step = r["dashboard_step_ms"]
        print(f"  round {i}: {r['snapshots']} snapshots read, step time seen by the page "
              + (f"{step:.1f} ms" if step is not None else "-")
              + f", snapshots {100 * r['snapshot_share']:.2f}% of the engine thread's time")
    o = result["overhead"]
    fmt = lambda x: f"{x:.3f}" if x is not None else "-"  # noqa: E731
    print(f"  open / closed (median of rounds): output tok/s {fmt(o['output_throughput_open_over_closed'])}, "
          f"p50 gap {fmt(o['p50_itl_open_over_closed'])}; snapshots {100 * o['snapshot_share']:.2f}% of the engine thread")
