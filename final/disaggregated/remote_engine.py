"""The server's engine, remote: stage 07's workers behind the OpenAI API (`serve --disaggregated`).

`RemoteEngine` is an EngineClient (engine_client.py), as the local AsyncEngine is, implemented by
stage 07's Dispatcher: each choice is one `Dispatcher.stream` (prefill worker chosen by the
routing policy, then a decode worker; or one unified replica), read on its own thread, its token
lines handed to the event loop as they come. The workers' exactly-once failover (replay) comes
with it.

Admission is decided at once, as in AsyncEngine: the context and the workers' pool size (the
same `check_fits` a local engine runs), and EngineClient's queue bound, which here counts the
choices in flight (429 beyond it).
What the workers cannot do is refused by name (400), never ignored: logprobs (the first token
is sampled on the prefill worker and comes without them, and the workers send no alternatives),
response_format (a grammar's token mask would have to run inside the workers' engines) and
priority (the workers schedule first come, first served). `n` is supported: n dispatches, choice
i with seed + i, as the local engine does.

Closing a stream (the client went away) sets each choice's cancel Event: the dispatcher stops at
the next token and closes the decode worker's stream (the worker aborts the request and frees
its blocks), or, between prefill and decode, cancels the prefill worker's held blocks at once.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, fields

import httpx

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s03_paged.block_manager import BlockManager
from course.s03_paged.engine import check_fits
from course.s04_continuous_batching.engine import QueueFullError
from course.s07_disaggregated.dispatcher import Dispatcher
from course.s07_disaggregated.router import NoAliveWorkerError

from ..engine_client import (EngineClient, EngineLimits, EventStream, GenerationRequest, RequestFailedError,
                             ShuttingDownError)
from ..metrics import ServerMetrics


class WorkerSizes:
    """What a request must fit on a worker: the context and the KV pool (sizes only)."""

    def __init__(self, tokenizer, eos_token_ids: list[int], max_model_len: int, num_blocks: int, block_size: int):
        self.tokenizer, self.eos_token_ids, self.max_model_len = tokenizer, list(eos_token_ids), max_model_len
        self.blocks = BlockManager(num_blocks, block_size)  # check_fits reads its sizes

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """As LLMEngine.make_sequence: ValueError / CacheCapacityError for a request that could
        never run on a worker (empty, longer than the context or than a worker's whole pool)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        check_fits(Sequence(prompt_ids, params, self.tokenizer, self.eos_token_ids), self.max_model_len, self.blocks)


def sampling_dict(params: SamplingParams) -> dict:
    """The JSON a worker's `sampling` field takes (every field but the processors)."""
    return {f.name: getattr(params, f.name) for f in fields(params) if f.name != "logits_processors"}


@dataclass(eq=False)
class _Call:
    """One API request on the remote path: its choices, each read on its own thread."""
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    n: int
    cancels: list[threading.Event] = field(default_factory=list)
    stopped: bool = False  # drained or shut down: the pump threads deliver nothing more
    done: int = 0          # choices whose thread has ended

    def put(self, item) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class RemoteStream(EventStream):
    """An EventStream of the remote path: closing it cancels every choice still on the workers
    (the dispatcher frees their blocks there)."""

    def __init__(self, call: _Call):
        super().__init__(call.events, call.n)
        self._call = call

    def _cancel(self) -> None:
        for cancel in self._call.cancels:
            cancel.set()


def worker_error(e: Exception) -> Exception:
    """A dispatcher failure as the exception whose status server.status_of gives."""
    if isinstance(e, httpx.HTTPStatusError):
        try:
            detail = e.response.json().get("detail", e.response.text)
        except ValueError:
            detail = e.response.text
        if e.response.status_code == 429:
            return QueueFullError(f"a worker's queue is full; retry later ({detail})")
        if e.response.status_code == 400:
            return ValueError(f"a worker refused the request: {detail}")
        return RequestFailedError(f"a worker failed this request ({e.response.status_code}): {detail}")
    if isinstance(e, NoAliveWorkerError):
        return RequestFailedError(f"no worker is left to run this request: {e}")
    return RequestFailedError(f"the workers failed this request: {type(e).__name__}: {e}")


class RemoteEngine(EngineClient):
    counted = "requests in flight"  # each choice in flight holds a thread and a connection

    def __init__(self, dispatcher: Dispatcher, limits: EngineLimits, sizes: WorkerSizes,
                 metrics: ServerMetrics | None = None, max_in_flight: int = 256):
        super().__init__(limits, max_in_flight, metrics)
        self.dispatcher, self.sizes = dispatcher, sizes
        self._calls: set[_Call] = set()
        self._lock = threading.Lock()

    @property
    def workers(self) -> dict[str, str]:
        """Each worker's URL by name (prefill-0, decode-0, replica-0...): the dashboard's per-worker view."""
        d = self.dispatcher
        return {f"{role}-{i}": url for role, urls in (("prefill", d.prefill_urls), ("decode", d.decode_urls),
                                                       ("replica", d.replicas)) for i, url in enumerate(urls)}

    def refuse(self, request: GenerationRequest) -> str | None:
        """An option the workers cannot honour, named, or None."""
        if request.priority:
            return (f"priority={request.priority} is not supported by the disaggregated server (--disaggregated): "
                    "its workers schedule first come, first served")
        if request.constrained or request.grammars:
            return ("response_format, tool calls (tool_choice other than none) and thinking_token_budget are not "
                    "supported by the disaggregated server (--disaggregated)")
        if any(p.logits_processors for p in request.params):
            return "logit_bias is not supported by the disaggregated server (--disaggregated)"
        if any(p.logprobs is not None or getattr(p, "prompt_logprobs", None) is not None for p in request.params):
            return "logprobs and prompt logprobs are not supported by the disaggregated server (--disaggregated)"
        return None

    def submit(self, request: GenerationRequest) -> RemoteStream:
        """All n choices or none, refusals raised at once. `request.speculative` is accepted
        either way: the workers never speculate, so there is nothing to switch off."""
        if (why := self.refuse(request)) is not None:
            raise ValueError(why)
        for p in request.params:
            self.sizes.check(request.prompt_ids, p)
        self._admit(request.n)
        call = _Call(asyncio.get_running_loop(), asyncio.Queue(), request.n)
        call.cancels = [threading.Event() for _ in request.params]
        with self._lock:
            self._calls.add(call)
        for index, p in enumerate(request.params):
            threading.Thread(target=self._pump, args=(call, index, list(request.prompt_ids), p), daemon=True,
                             name="remote-choice").start()
        self.metrics.running.set(self._waiting)
        return RemoteStream(call)

    def _pump(self, call: _Call, index: int, prompt_ids: list[int], params: SamplingParams) -> None:
        """One choice: the dispatcher's token lines, as TokenEvents, to the event loop."""
        cancel, start, last, n, reason = call.cancels[index], time.monotonic(), None, 0, None
        try:
            for line in self.dispatcher.stream(prompt_ids, sampling_dict(params), cancel=cancel):
                now = time.monotonic()
                (self.metrics.ttft if last is None else self.metrics.itl).observe(now - (last or start))
                last, n, reason = now, n + 1, line.get("finish_reason")
                if not call.stopped:
                    call.put((index, TokenEvent(line["token_id"], line["text"], reason)))
                if reason:
                    break
            else:
                if not cancel.is_set() and not call.stopped:  # the stream ended without its last line
                    call.put(RequestFailedError("the workers' stream ended before the request finished"))
        except Exception as e:  # noqa: BLE001 - every failure reaches the client, as an error
            if not call.stopped:
                call.put(worker_error(e))
        finally:
            self._finished(call, len(prompt_ids), n, reason or "abort", start)

    def _finished(self, call: _Call, prompt_tokens: int, tokens: int, reason: str, start: float) -> None:
        m = self.metrics
        m._success.labels(m.model, reason).inc()
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(tokens)
        m.e2e.observe(time.monotonic() - start)
        self._release(1)
        with self._lock:
            call.done += 1
            if call.done == call.n:
                self._calls.discard(call)
        m.running.set(self._waiting)

    def drain(self, timeout: float, hurry: threading.Event | None = None) -> int:
        """As AsyncEngine.drain: admit nothing more, let the choices in flight finish for up to
        `timeout` seconds (or until `hurry`), then stop the rest. Returns how many were stopped."""
        self.accepting = False
        deadline, hurry = time.monotonic() + timeout, hurry or threading.Event()
        while time.monotonic() < deadline and not hurry.is_set() and self._waiting:
            hurry.wait(0.05)
        return self._stop_all(ShuttingDownError("the server is shutting down: this request was stopped "
                                                "before it finished"))

    def _stop_all(self, error: Exception) -> int:
        with self._lock:
            calls, stopped = list(self._calls), self._waiting
        for call in calls:
            call.put(error)
            call.stopped = True
            for cancel in call.cancels:
                cancel.set()
        return stopped if calls else 0

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop whatever is still in flight and wait (bounded) for its threads to let go of the
        workers, so the caller may stop them next."""
        self.accepting = False
        self._stop_all(ShuttingDownError("the server is shutting down; this request was stopped"))
        deadline = time.monotonic() + timeout_s
        while self._waiting and time.monotonic() < deadline:
            time.sleep(0.05)


# ---- `python -m course.final serve --disaggregated` ------------------------------------------------
# The local engine's options the workers do not take: refused with --disaggregated, never ignored.
LOCAL_ONLY = ["max_num_seqs", "device", "dtype", "gpu_memory_utilization", "attention_backend", "cuda_graphs",
              "graph_max_seq_len", "graph_max_num_tokens", "fused", "linear_splits", "quantization", "overlap",
              "speculative_method",
              "num_speculative_tokens", "speculative_disable_by_batch_size", "scheduling_policy", "cost_model",
              "mlfq_base_quantum", "mlfq_ratio", "mlfq_levels", "mlfq_starvation"]
TOPOLOGY = ["prefill", "decode", "replicas", "routing_policy"]


def check_flags(args: argparse.Namespace, defaults: dict) -> None:
    """ValueError for a flag that does not fit the chosen mode, named."""
    if not args.disaggregated:
        given = [name for name in TOPOLOGY if getattr(args, name) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --disaggregated")
        return
    given = [name for name in LOCAL_ONLY if getattr(args, name) != defaults[name]]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} is not supported with --disaggregated "
                         "(the stage 07 workers run their own engines)")
    if args.replicas is not None and (args.prefill is not None or args.decode is not None):
        raise ValueError("give --prefill/--decode or --replicas, not both")
    if (args.replicas is not None and args.replicas < 1) or min(args.prefill or 1, args.decode or 1) < 1:
        raise ValueError("need --prefill >= 1 and --decode >= 1, or --replicas >= 1")


def serve_disaggregated(args: argparse.Namespace, assemble_app) -> int:
    """Start the workers (stage 07's Topology), serve the OpenAI API over them until Ctrl-C or
    SIGTERM (a drain, as the local server's), then stop the workers, whatever happened.
    `assemble_app`: cli.py's, the app with every room's plug-in."""
    from transformers import AutoTokenizer

    from course.s01_decode_loop.config import ModelConfig
    from course.s01_decode_loop.weights import ModelLoadError
    from course.s07_disaggregated.cli import resolve_model_dir
    from course.s07_disaggregated.launcher import Topology

    from ..launch.heap import freeze_startup_heap
    from ..launch.kv_pool import num_kv_blocks, parse_size
    from ..security.options import door_from_args, uvicorn_options
    from ..server import ServerLimits
    from ..shutdown import serve_until_stopped

    try:
        max_request_bytes = parse_size(args.max_request_bytes, "--max-request-bytes")
        door = door_from_args(args)  # API keys, TLS files (security/)
        model_dir = resolve_model_dir(args.model)
        if not (model_dir / "config.json").is_file():
            raise ModelLoadError(f"{model_dir} has no config.json: not a Hugging Face model folder")
        config = ModelConfig.from_json(model_dir / "config.json")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = getattr(args, "chat_template", None) or tokenizer.chat_template
        kv_memory = parse_size(args.kv_memory, "--kv-memory") if args.kv_memory is not None else None
        import torch
        from course.s03_paged.quantized_kv import storage_dtype
        kv_dtype = storage_dtype(args.kv_cache_dtype, torch.float32)  # the workers load float32
        blocks = num_kv_blocks(args, kv_memory, config, torch.float32, kv_dtype=kv_dtype)
    except (ValueError, ModelLoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    eos = list(config.eos_token_ids) + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None
                                        and tokenizer.eos_token_id not in config.eos_token_ids else [])
    replicas = args.replicas or 0
    worker_args = ["--kv-blocks", str(blocks), "--block-size", str(args.block_size), "--kv-cache-dtype",
                   args.kv_cache_dtype, "--max-num-batched-tokens", str(args.max_num_batched_tokens or 256)]
    # Until uvicorn takes over the signals, a SIGTERM unwinds like Ctrl-C, so the workers stop too.
    def interrupt(*_):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with Topology(model_dir, 0 if replicas else (args.prefill or 1), 0 if replicas else (args.decode or 1),
                      worker_args=worker_args, num_unified=replicas) as topology:
            for worker in topology.workers:
                print(f"{worker.role} worker: {worker.url} (pid {worker.process.pid})", file=sys.stderr, flush=True)
            urls = lambda ws: [w.url for w in ws]  # noqa: E731
            dispatcher = Dispatcher(urls(topology.prefill), urls(topology.decode), replicas=urls(topology.unified),
                                    policy=args.routing_policy or "cache_aware", block_size=args.block_size,
                                    router_options={"max_tree_tokens": blocks * args.block_size})
            name = args.served_model_name or (args.model or "SmolLM2-135M-Instruct")
            max_len = config.max_position_embeddings  # as the workers' engines
            engine = RemoteEngine(dispatcher, EngineLimits(max_len, config.vocab_size, tuple(eos), config.architecture),
                                  WorkerSizes(tokenizer, eos, max_len, blocks, args.block_size),
                                  ServerMetrics(name), max_in_flight=args.max_waiting)
            limits = ServerLimits(max_request_bytes=max_request_bytes, grammar_timeout_s=args.grammar_timeout)
            app = assemble_app(engine, tokenizer, name, limits, door, not args.no_dashboard,
                               getattr(args, "reasoning_parser", "auto"))
            signal.signal(signal.SIGTERM, previous)  # uvicorn installs its own (a drain) from here
            freeze_startup_heap()  # no schema compiles here (the workers refuse response_format)
            try:
                serve_until_stopped(app, engine, args.host, args.port, args.drain_timeout,
                                    **uvicorn_options(args.host, door))
            finally:
                dispatcher.close()
        return 0  # leaving the `with` stopped the workers
    except KeyboardInterrupt:  # while the workers were starting: Topology stopped them
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
