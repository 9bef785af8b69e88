"""Soak test: many mixed requests at once against the OpenAI-compatible server, then checks.

    python -m course.final.stress.soak                                # its own tiny server, a KV pool that preempts
    python -m course.final.stress.soak --model default --requests 60  # its own server on SmolLM2
    python -m course.final.stress.soak --url http://127.0.0.1:8000    # a server already running

The workload is drawn from `--seed`, so a run sends the same requests every time: both routes,
streamed and not, greedy and seeded sampling, `n` of 1..3, stop strings, varied `max_tokens`,
`ignore_eos` on some (exact lengths). Some streaming clients hang up mid-stream, some
non-streaming clients give up (a client timeout shorter than the answer takes). At most
`--concurrency` requests are in flight; a run stops at `--max-seconds`, never hangs.

It checks, and prints every violation (exit status 1 if any):
  1. every request not abandoned got one complete answer: 200 (429 only with --allow-429), a
     stream ends with `data: [DONE]`, every choice 0..n-1 has a finish_reason, no error event;
  2. each answer equals the same body sent alone afterwards, unstreamed (text and
     finish_reason per choice); a hung-up stream's text is a prefix of it;
  3. usage: completion_tokens = the token chunks streamed, and equal to the replay's, as are
     the prompt_tokens;
  4. afterwards /metrics shows nothing running, nothing waiting and no KV block in use, and
     the server aborted no more requests than clients abandoned.
Checks 4 and the counts read from /metrics assume no one else is using the server meanwhile.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx
import torch

from course.s01_decode_loop.bench.measure import write_json
from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
from course.s01_decode_loop.weights import ModelLoadError, load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

from ..async_engine import AsyncEngine
from ..engine import Engine
from ..launch.model_fit import engine_class
from ..metrics import ServerMetrics
from .soak_client import Answer, Job, check_complete, compare, plan, send
from ..testing import CHAT_TEMPLATE, live_server, metric

# ---- the run ------------------------------------------------------------------------------
@dataclass
class SoakReport:
    url: str
    requests: int = 0
    completed: int = 0
    disconnected: int = 0          # streams the client hung up on
    gave_up: int = 0               # non-streams whose client timed out
    rate_limited: int = 0          # 429s (allowed only with --allow-429)
    preemptions: float = 0         # vllm:num_preemptions_total during the run
    aborted: float = 0             # vllm:request_success_total{finished_reason="abort"} during the run
    compared: int = 0              # answers replayed alone and compared
    mismatches: int = 0            # requests failing check 2 or 3
    lost: int = 0                  # requests failing check 1
    statuses: dict = field(default_factory=dict)
    gauges: dict = field(default_factory=dict)
    wall_s: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def read_metric(url: str, name: str, missing: float = float("nan"), **labels) -> float:
    """A sample from /metrics; `missing` if it is not there (NaN: never 0 by accident), NaN if
    the server does not answer."""
    try:
        return metric(url, name, **labels)
    except KeyError:
        return missing
    except httpx.HTTPError:
        return float("nan")


def counters(url: str) -> dict[str, float]:
    # a labelled counter has no sample until it first counts
    return {"preemptions": read_metric(url, "vllm:num_preemptions_total"),
            "aborted": read_metric(url, "vllm:request_success_total", 0.0, finished_reason="abort")}


async def settle(url: str, seconds: float) -> dict[str, float]:
    """Check 4: poll the gauges until they are all 0 (the engine refreshes them every turn)."""
    end = time.monotonic() + seconds
    while True:
        gauges = {name: read_metric(url, name) for name in GAUGES}
        if not any(gauges.values()) or time.monotonic() > end:
            return gauges
        await asyncio.sleep(0.1)


async def run_jobs(http: httpx.AsyncClient, jobs: list[Job], concurrency: int,
                   deadline: float) -> list[Answer | None]:
    """All jobs, at most `concurrency` at once; None for those unfinished at the deadline."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Job) -> Answer:
        async with gate:
            return await send(http, job)

    tasks = [asyncio.create_task(one(job)) for job in jobs]
    await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for t in tasks:
        t.cancel()  # no-op on finished ones; the rest are past the deadline
    await asyncio.gather(*tasks, return_exceptions=True)
    return [None if t.cancelled() else Answer(problems=[f"client crashed: {t.exception()!r}"]) if t.exception()
            else t.result() for t in tasks]


async def soak(url: str, *, requests: int = 60, concurrency: int = 16, seed: int = 0, max_seconds: float = 600,
               max_tokens: int = 48, give_up_max: float = 0.3, allow_429: bool = False,
               settle_s: float = 5.0) -> SoakReport:
    """Send the planned requests, wait for the server to settle, replay, check (see the top)."""
    start = time.monotonic()
    deadline, jobs, report = start + max_seconds, plan(requests, seed, max_tokens, give_up_max), SoakReport(url)
    before = counters(url)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=10), limits=limits) as http:
        answers = await run_jobs(http, jobs, concurrency, deadline)
        report.gauges = await settle(url, settle_s)
        after = counters(url)  # before the replays, which preempt nothing and abort nothing
        to_replay = tally(report, jobs, answers, allow_429)
        await replay_all(http, report, to_replay, deadline)
    report.preemptions, report.aborted = (after[k] - before[k] for k in ("preemptions", "aborted"))
    check_server(report, jobs, answers)
    report.wall_s = time.monotonic() - start
    return report


def tally(report: SoakReport, jobs: list[Job], answers: list[Answer | None],
          allow_429: bool) -> list[tuple[Job, Answer]]:
    """Count outcomes, record check-1 violations; return the answers to compare with a replay."""
    report.requests, to_replay = len(jobs), []
    for job, ans in zip(jobs, answers):
        if ans is None:
            report.lost += 1
            report.violations.append(f"{job.label()}: no answer before the deadline")
            continue
        if ans.status is not None:  # a client that gave up saw none
            report.statuses[str(ans.status)] = report.statuses.get(str(ans.status), 0) + 1
        if ans.abandoned == "gave up":
            report.gave_up += 1
            continue
        problems = check_complete(job, ans, allow_429) if not ans.abandoned else ans.problems
        if problems:
            report.lost += 1
            report.violations += [f"{job.label()}: {p}  body: {json.dumps(job.body)}" for p in problems]
        elif ans.status == 429:
            report.rate_limited += 1
        else:
            report.disconnected += ans.abandoned == "disconnected"
            report.completed += not ans.abandoned
            to_replay.append((job, ans))
    return to_replay


async def replay_all(http: httpx.AsyncClient, report: SoakReport, pairs: list[tuple[Job, Answer]],
                     deadline: float) -> None:
    """Send each body alone, one after the other, unstreamed, and compare (checks 2 and 3)."""
    for job, ans in pairs:
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                alone = await send(http, job, replay=True)
        except TimeoutError:
            report.violations.append(f"the deadline passed while replaying: {report.compared} of {len(pairs)} "
                                     "answers compared")
            return
        report.compared += 1
        problems = [f"alone: {p}" for p in check_complete(job, alone)] or compare(job, ans, alone)
        if problems:
            report.mismatches += 1
            report.violations += [f"{job.label()}: {p}  body: {json.dumps(job.body)}" for p in problems]


def check_server(report: SoakReport, jobs: list[Job], answers: list[Answer | None]) -> None:
    """Check 4, and that the server aborted no more choices than clients abandoned."""
    report.violations += [f"after the run {name} = {value}, not 0" for name, value in report.gauges.items() if value]
    left = sum(job.n for job, ans in zip(jobs, answers) if ans is None or ans.abandoned)
    if report.aborted > left:
        report.violations.append(f"the server aborted {report.aborted:g} requests, but clients abandoned only "
                                 f"{left} choices")


def run_soak(url: str, **kwargs) -> SoakReport:
    """`soak` for callers without an event loop (the tests, `main`)."""
    return asyncio.run(soak(url, **kwargs))


# ---- its own server -----------------------------------------------------------------------
@contextlib.contextmanager
def own_server(model: str | None = None, kv_blocks: int = 24, block_size: int | None = None, max_num_seqs: int = 8,
               max_waiting: int = 256, max_num_batched_tokens: int = 256):
    """A server in this process on a free loopback port, over `model` (None: the tiny random
    model), with a KV pool small enough to force preemptions (a model with sliding layers beside
    full ones: its sliding group's pool sized for `max_num_seqs` windows and one step's tokens)."""
    if model is None:
        tok = byte_tokenizer()
        tok.chat_template = CHAT_TEMPLATE
        net, eos, name, block_size = tiny_model("gqa_tied"), [tok.eos_token_id], "tiny", block_size or 4
    else:
        loaded = load_model(None if model == "default" else model)
        net, tok, eos, name, block_size = loaded.model, loaded.tokenizer, loaded.eos_token_ids, model, block_size or 16
    config = KernelEngineConfig(num_blocks=kv_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                                max_waiting=max_waiting, max_num_batched_tokens=max_num_batched_tokens,
                                record_steps=False)
    # The tiny model's matrices are too small to share between threads, and on a busy CPU
    # OpenMP's spinning threads make each step 100x slower (measured: 360 ms vs 4 ms).
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if model is None else threads)
    try:
        engine = engine_class(net, Engine)(net, tok, config, eos)  # a hybrid model: with its state cache
        with live_server(AsyncEngine(engine, ServerMetrics(name)), tok, name) as url:
            yield url
    finally:
        torch.set_num_threads(threads)


# ---- the command --------------------------------------------------------------------------
def print_report(r: SoakReport) -> None:
    rows = [("requests sent", r.requests), ("completed", r.completed), ("disconnected mid-stream", r.disconnected),
            ("gave up (not streamed)", r.gave_up), ("429s", r.rate_limited), ("preemptions", f"{r.preemptions:g}"),
            ("aborted (server)", f"{r.aborted:g}"), ("compared alone", r.compared), ("mismatches", r.mismatches),
            ("lost", r.lost), ("statuses", r.statuses),
            *((name, f"{value:g}") for name, value in r.gauges.items()), ("wall time", f"{r.wall_s:.1f} s")]
    print(f"soak of {r.url}")
    for name, value in rows:
        print(f"  {name:28} {value}")
    for v in r.violations:
        print(f"VIOLATION {v}")
    print("OK" if r.ok else f"FAILED: {len(r.violations)} violation(s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.final.stress.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one in this process)")
    p.add_argument("--model", help='own server: a model folder, .gguf or "default" (default: the tiny random model)')
    p.add_argument("--kv-blocks", type=int, default=24, help="own server: KV blocks (few, to force preemption)")
    p.add_argument("--block-size", type=int, help="own server: tokens per block (default 4 tiny, 16 a model)")
    p.add_argument("--max-num-seqs", type=int, default=8, help="own server")
    p.add_argument("--max-waiting", type=int, default=256, help="own server: the queue bound")
    p.add_argument("--max-num-batched-tokens", type=int, default=256, help="own server: tokens a step")
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=48, help="max_tokens is drawn from 4..this")
    p.add_argument("--give-up-max", type=float, default=0.3, help="seconds: a giving-up client's timeout is below")
    p.add_argument("--max-seconds", type=float, default=600, help="overall deadline; past it the run fails")
    p.add_argument("--allow-429", action="store_true", help="count 429s instead of failing on them")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    kwargs = dict(requests=args.requests, concurrency=args.concurrency, seed=args.seed, max_seconds=args.max_seconds,
                  max_tokens=args.max_tokens, give_up_max=args.give_up_max, allow_429=args.allow_429)
    with contextlib.ExitStack() as stack:
        try:
            url = args.url.rstrip("/") if args.url else stack.enter_context(
                own_server(args.model, args.kv_blocks, args.block_size, args.max_num_seqs, args.max_waiting,
                           args.max_num_batched_tokens))
        except (ValueError, ModelLoadError) as e:  # a bad --model or pool size: say so, no traceback
            print(f"error: {e}", file=sys.stderr)
            return 2
        report = run_soak(url, **kwargs)
    print_report(report)
    if args.json:
        write_json(args.json, asdict(report) | {"ok": report.ok, "settings": vars(args)})
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
