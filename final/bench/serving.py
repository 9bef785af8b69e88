"""Serving benchmark: a client that loads a running server the way users do.

    python -m course.final serve &                       # the server under test
    python -m course.final.bench.serving --request-rate 1 --num-requests 40 --json r1.json
    python -m course.final.bench.serving --request-rate inf --dashboard-watchers 1   # the page's cost

Requests are ShareGPT prompts with their real answer lengths (stage 01's `sample_requests`, as
vLLM's benchmark_serving samples them), sent to `/v1/chat/completions` (or `/v1/completions`)
at Poisson arrival times, streaming, with `ignore_eos` so each generates exactly its answer's
length. Per request the client records, from its own clock:

  TTFT  send -> first token chunk         TPOT  (e2e - TTFT) / (output tokens - 1)
  ITL   gaps between token chunks         e2e   send -> last chunk

and reports p50/p99/mean of each, request and output-token throughput, and the failures (a
4xx/5xx or a broken stream counts as failed, with its message, and never stops the run).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from course.s01_decode_loop.bench.measure import bench_cli, percentile
from course.s01_decode_loop.bench.workloads import arrival_times


@dataclass
class RequestResult:
    prompt_chars: int
    output_len: int                  # tokens asked for
    ok: bool = False
    error: str = ""
    output_tokens: int = 0           # token chunks received
    usage_tokens: int | None = None  # what the server's usage says
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(endpoint: str, prompt: str, output_len: int, model: str | None, extra: dict | None = None) -> dict:
    body = (extra or {}) | {"max_tokens": output_len, "stream": True, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if endpoint == "chat":
        return body | {"messages": [{"role": "user", "content": prompt}]}
    return body | {"prompt": prompt}


async def send(http: httpx.AsyncClient, endpoint: str, prompt: str, output_len: int,
               model: str | None, extra: dict | None = None) -> RequestResult:
    result = RequestResult(len(prompt), output_len)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", path, json=request_body(endpoint, prompt, output_len, model, extra)) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk, now = json.loads(line[6:]), time.perf_counter()
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.usage_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                if result.ttft_s is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                result.output_tokens += 1
                last = now
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e_s, result.ok = last - start, result.ttft_s is not None
    return result


async def run(base_url: str, requests: list[tuple[str, int]], rate: float, endpoint: str = "chat",
              model: str | None = None, max_concurrency: int | None = None, seed: int = 0,
              extra_body: dict | None = None) -> dict:
    """Send (prompt, output_len) pairs at Poisson times; return the summary and every result.
    `extra_body`: more request fields for a server that needs them (llama.cpp's logit_bias)."""
    arrivals = arrival_times(len(requests), rate, seed)
    gate = asyncio.Semaphore(max_concurrency or len(requests) or 1)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(None, connect=10), limits=limits) as http:
        start = time.perf_counter()

        async def one(at: float, prompt: str, output_len: int) -> RequestResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            async with gate:
                return await send(http, endpoint, prompt, output_len, model, extra_body)
        results = await asyncio.gather(*(one(at, p, n) for at, (p, n) in zip(arrivals, requests)))
        duration = time.perf_counter() - start
    return {"summary": summarize(results, duration) | {"request_rate": rate, "endpoint": endpoint},
            "requests": [asdict(r) | {"tpot_s": r.tpot_s} for r in results]}


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    out = {"completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
           "request_throughput": len(ok) / duration, "output_tokens": sum(r.output_tokens for r in ok),
           "output_throughput": sum(r.output_tokens for r in ok) / duration,
           "errors": sorted({r.error for r in results if not r.ok})[:5]}
    series = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
              "itl": [g for r in ok for g in r.itl_s], "e2e": [r.e2e_s for r in ok]}
    for name, xs in series.items():
        out[f"mean_{name}_s"] = sum(xs) / len(xs) if xs else None
        out[f"p50_{name}_s"], out[f"p99_{name}_s"] = percentile(xs, 50), percentile(xs, 99)
    return out


def print_summary(s: dict) -> None:
    print(f"rate {s['request_rate']} req/s, {s['completed']} completed, {s['failed']} failed, "
          f"{s['duration_s']:.1f} s")
    print(f"  throughput: {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s")
    for name in ("ttft", "tpot", "itl", "e2e"):
        vals = [s[f"{k}_{name}_s"] for k in ("mean", "p50", "p99")]
        if vals[0] is not None:
            print(f"  {name.upper():>4} ms: mean {vals[0] * 1e3:8.1f}  p50 {vals[1] * 1e3:8.1f}  p99 {vals[2] * 1e3:8.1f}")
    for e in s["errors"]:
        print(f"  error: {e}")


def sharegpt_requests(tokenizer_path: str | None, n: int, seed: int, max_prompt: int,
                      max_output: int) -> list[tuple[str, int]]:
    from transformers import AutoTokenizer

    from course.s01_decode_loop.default_model import ensure_default_model
    from course.s01_decode_loop.bench.workloads import sample_requests

    tok = AutoTokenizer.from_pretrained(tokenizer_path or ensure_default_model())
    return [(r.prompt, r.output_len) for r in sample_requests(tok, n, seed, max_prompt, max_output)]


def write_guidellm_data(path: str, requests: list[tuple[str, int]], arrivals: list[float]) -> None:
    """JSONL that guidellm's replay profile sends exactly as we do: same prompts, lengths, times."""
    with open(path, "w") as f:
        for (prompt, n), at in zip(requests, arrivals):
            f.write(json.dumps({"prompt": prompt, "output_tokens_count": n, "relative_timestamp": at}) + "\n")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--model", help="the model field to send (default: none; the server has one model)")
    p.add_argument("--tokenizer", help="for ShareGPT lengths (default: the default model's)")
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--request-rate", type=float, default=1.0, help="requests/s, Poisson; inf = all at once")
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-output-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dashboard-watchers", type=int, default=0, metavar="N",
                   help="measure the dashboard's cost: each round runs the load with no page open, then with N "
                        "pages reading /dashboard/events (dashboard/overhead.py)")
    p.add_argument("--dashboard-rounds", type=int, default=2, help="rounds of (closed, open) with --dashboard-watchers")
    p.add_argument("--guidellm-data", metavar="PATH",
                   help="instead of running, write these requests and send times as guidellm replay data")


def run_client(args: argparse.Namespace) -> dict:
    """The summary and every request's timings (or, with --guidellm-data, where the requests went)."""
    requests = sharegpt_requests(args.tokenizer, args.num_requests, args.seed, args.max_prompt_tokens,
                                 args.max_output_tokens)
    if args.guidellm_data:
        write_guidellm_data(args.guidellm_data, requests, arrival_times(len(requests), args.request_rate, args.seed))
        return {"guidellm_data": args.guidellm_data, "num_requests": len(requests)}
    if args.dashboard_watchers:  # the same load, page closed and open, side by side
        from ..dashboard.overhead import side_by_side
        return asyncio.run(side_by_side(args.base_url, requests, args.request_rate, args.dashboard_watchers,
                                        args.dashboard_rounds, endpoint=args.endpoint, model=args.model,
                                        max_concurrency=args.max_concurrency, seed=args.seed))
    result = asyncio.run(run(args.base_url, requests, args.request_rate, args.endpoint, args.model,
                             args.max_concurrency, args.seed))
    result["summary"] |= {"num_requests": args.num_requests, "max_output_tokens": args.max_output_tokens}
    return result


def report(result: dict) -> None:
    if "overhead" in result:
        from ..dashboard.overhead import print_overhead
        print_overhead(result)
    elif "summary" in result:
        print_summary(result["summary"])
    else:
        print(f"wrote {result['num_requests']} requests to {result['guidellm_data']}")


main = bench_cli(__doc__, add_args, run_client, report, module="course.final.bench.serving")

if __name__ == "__main__":
    main()
