"""What a new JSON schema costs its first request: time to the first token through the server,
for a schema the server has never seen against the same schema once cached.

    python -m course.final.bench.schema_ttft [--max-tokens 8] [--results]

The server is `python -m course.final serve`'s own (`build_server`, the default model, the CPU
defaults), on a local port, driven by streamed chat requests one at a time. The schemas: stage
08's four examples and its twelve real-world ones (`realworld/schemas/`). For each schema, the
first request (compile + first mask) and then the same request again (a cache hit), greedy,
`--max-tokens` tokens; time to the first streamed token of each. Three ways of making the masks,
side by side in one run: lazily, a position's mask the first time a request reaches it, by
stage 08's walk in C (the server's way, `native/`) or by the lesson's numpy walk
(`lazy_lesson`), and precomputed for every position at compile time (stage 08's default, the
first request waits for all of it). A request with no schema gives the floor.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from course.s01_decode_loop.bench.measure import bench_cli


def first_token_seconds(url: str, schema: dict | None, max_tokens: int) -> float:
    body = {"messages": [{"role": "user", "content": "Reply with a JSON object for this schema."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            choices = json.loads(line[6:])["choices"] if line.startswith("data: {") else None
            if choices and choices[0]["delta"].get("content"):
                return time.perf_counter() - start
    raise RuntimeError("no token came back")


MODES = ("lazy", "lazy_lesson", "precomputed")


def run(args: argparse.Namespace) -> dict:
    from course.s08_structured.mask_cache import classify_position
    from course.s08_structured.realworld.bench_finish import example_and_realworld_schemas

    from ..cli import build_server, make_parser, ready_to_serve
    from ..testing import running_server

    server_args = make_parser()[0].parse_args(["serve"])
    engine, app = build_server(server_args)
    tokenizer = engine.engine.tokenizer
    rows, floor = [], []
    with running_server(engine, tokenizer, "SmolLM2-135M-Instruct", app=app) as (url, srv):  # `serve`'s own app
        grammars = srv.config.app.state.grammars
        ready_to_serve(srv.config.app)  # as `serve` does before it answers
        for _ in range(3):
            floor.append(first_token_seconds(url, None, args.max_tokens))
        served_walk = grammars.classify
        for mode in MODES:
            grammars.precompute = mode == "precomputed"
            grammars.classify = classify_position if mode == "lazy_lesson" else served_walk
            for name, schema in example_and_realworld_schemas().items():
                tagged = {**schema, "description": f"{mode} {name}"}  # a cache entry of its own per mode
                try:
                    fresh = first_token_seconds(url, tagged, args.max_tokens)
                    cached = first_token_seconds(url, tagged, args.max_tokens)
                except RuntimeError as e:
                    rows.append({"schema": name, "mode": mode, "error": str(e)})
                    continue
                rows.append({"schema": name, "mode": mode, "fresh_s": fresh, "cached_s": cached,
                             "ratio": fresh / cached})
                print(f"{mode:>11} {name}: first {fresh * 1e3:7.1f} ms, cached {cached * 1e3:6.1f} ms", flush=True)
    summary = {}
    for mode in MODES:
        ok = [r for r in rows if r["mode"] == mode and "ratio" in r]
        ratios = sorted(r["ratio"] for r in ok)
        summary[mode] = {"schemas": len(ok), "median_fresh_ms": statistics.median(r["fresh_s"] for r in ok) * 1e3,
                         "median_cached_ms": statistics.median(r["cached_s"] for r in ok) * 1e3,
                         "median_ratio": statistics.median(ratios), "max_ratio": ratios[-1]}
    return {"max_tokens": args.max_tokens, "no_schema_ms": statistics.median(floor) * 1e3, "summary": summary,
            "rows": rows}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=8)


def report(result: dict) -> None:
    print(f"no schema: first token {result['no_schema_ms']:.1f} ms")
    for mode, s in result["summary"].items():
        print(f"{mode:>11}: first request with a new schema {s['median_fresh_ms']:.1f} ms, cached "
              f"{s['median_cached_ms']:.1f} ms (median over {s['schemas']} schemas): {s['median_ratio']:.2f}x, "
              f"worst {s['max_ratio']:.2f}x")


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.schema_ttft")

if __name__ == "__main__":
    main()
