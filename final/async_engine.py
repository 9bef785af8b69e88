"""The local engine client: the engine loop in its own thread, with an asyncio face for the server.

The model's forward pass blocks for tens of milliseconds; run on the event loop, it would
freeze every connection. So one thread owns the engine and does nothing but `step()`; the
server's coroutines talk to it through a command queue (add, abort, call) and get their tokens
back through one asyncio.Queue per request. Only the engine thread ever touches the engine's
state, so the engine needs no locks.

Admission (engine_client.py) is decided on the caller's thread, at once: `submit` checks the
prompt, the context and the queue bound and raises before anything is queued. The queue bound
counts requests admitted but not yet scheduled.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s04_continuous_batching.policy import Priority

from .engine import Engine
from .engine_client import (EngineClient, EngineLimits, EventStream, GenerationRequest, RequestFailedError,
                            ShuttingDownError)
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine step failed; every request in flight could not be completed."""


@dataclass(eq=False)
class _Group:
    """One API request on the engine thread: its choices' sequences and where their tokens go."""
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    request: GenerationRequest
    seqs: list[Sequence]
    request_ids: list[int] = field(default_factory=list)  # filled by the engine thread


class RequestStream(EventStream):
    """An EventStream of the local engine: closing it aborts the request on the engine thread
    and frees its KV blocks."""

    def __init__(self, engine: "AsyncEngine", group: _Group):
        super().__init__(group.events, len(group.seqs))
        self._engine, self._group = engine, group

    def _cancel(self) -> None:
        self._engine._commands.put(("abort", self._group))


class AsyncEngine(EngineClient):
    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None):
        limits = EngineLimits(engine.max_model_len, engine.model.config.vocab_size, tuple(engine.eos_token_ids),
                              engine.model.config.architecture)
        super().__init__(limits, engine.config.max_waiting, metrics)
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[int, tuple[_Group, int]] = {}  # request id -> (its group, its index)
        self._unscheduled: set[int] = set()  # engine thread: admitted ids not yet scheduled once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        # called on the engine thread with the engine after every loop turn (the dashboard's watch);
        # the same seam as stage 07's EngineLoop.after_turn
        self.after_turn: list[Callable[[Engine], None]] = []

    def start(self) -> "AsyncEngine":
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop the engine thread; whatever is still in flight ends with ShuttingDownError."""
        self.accepting = False
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join(timeout=10)

    # ---- the caller's side ----------------------------------------------------------------
    def refuse(self, request: GenerationRequest) -> str | None:
        if request.priority and not isinstance(self.engine.scheduler.policy, Priority):  # as vLLM: never ignored
            return f"priority={request.priority} needs a server started with --scheduling-policy priority"
        return None

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Admit the request's choices, all or none, and return their stream. Raises at once,
        queueing nothing: ShuttingDownError, ValueError (empty prompt, n beyond the queue bound),
        CacheCapacityError (too long for the context or the whole KV pool; a ValueError too),
        QueueFullError."""
        seqs = [self.engine.make_sequence(request.prompt_ids, request.sampling(i))  # reads fixed sizes only
                for i in range(request.n)]
        self._admit(len(seqs))
        group = _Group(asyncio.get_running_loop(), asyncio.Queue(), request, seqs)
        self._commands.put(("add", group))
        return RequestStream(self, group)

    async def generate_many(self, prompt_ids: list[int],
                            params: list[SamplingParams]) -> AsyncIterator[tuple[int, TokenEvent]]:
        """`submit` as an async generator: admission errors raise at the first `anext`."""
        stream = self.submit(GenerationRequest(prompt_ids, params))
        try:
            async for item in stream:
                yield item
        finally:
            stream.close()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        """Stream one request's tokens."""
        async for _, event in self.generate_many(prompt_ids, [params]):
            yield event

    def drain(self, timeout: float, hurry: threading.Event | None = None) -> int:
        """Graceful shutdown, called from any thread but the engine's (see EngineClient.drain)."""
        self.accepting = False
        deadline, hurry = time.monotonic() + timeout, hurry or threading.Event()
        while time.monotonic() < deadline and not hurry.is_set():
            if self.call(lambda e: not self._streams):  # the call queues behind pending adds
                return 0
            hurry.wait(0.05)
        return self.call(lambda e: self._fail_all(ShuttingDownError(
            "the server is shutting down: this request was stopped before it finished")))

    def call(self, fn):
        """Run `fn(engine)` on the engine thread and return its result (for stats, tests)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, done))
        return done.result(timeout=30)

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._handle_commands(block=not self.engine.has_unfinished())
            if self.engine.has_unfinished():
                self._step()
            self._note_scheduled()
            self.metrics.engine_updated(self.engine)
            for hook in self.after_turn:
                try:
                    hook(self.engine)
                except Exception:  # a hook's bug (a snapshot's, say) must not stop the engine
                    log.exception("after-turn hook %r failed", hook)
        self._handle_commands(block=False)  # adds that raced the stop still get their answer
        self._fail_all(ShuttingDownError("the server is shutting down; this request was stopped"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # keep serving: fail the requests in flight, not the server
            self._fail_all(EngineDeadError(f"engine step failed: {type(e).__name__}: {e}"))
            return
        for out in outputs:
            if out.error is not None:
                self._deliver(out.request_id, RequestFailedError(
                    f"this request failed in the engine: {type(out.error).__name__}: {out.error}"))
                self._retire(out.request_id)
                continue
            if out.request_id in self._streams:
                self._deliver(out.request_id, out.event)
            if out.event.finish_reason:
                self._retire(out.request_id)

    def _deliver(self, request_id: int, event) -> None:
        group, index = self._streams[request_id]
        item = event if isinstance(event, BaseException) else (index, event)
        try:
            group.loop.call_soon_threadsafe(group.events.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self._abort(request_id)

    def _handle_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd[0] == "add":
                self._add(cmd[1])
            elif cmd[0] == "abort":
                for rid in cmd[1].request_ids:
                    self._abort(rid)
            elif cmd[0] == "call":
                _, fn, done = cmd
                try:
                    done.set_result(fn(self.engine))
                except Exception as e:
                    done.set_exception(e)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, group: _Group) -> None:
        request = group.request
        for index, seq in enumerate(group.seqs):  # admitted already: cannot be refused
            rid = self.engine.add_sequence(seq, request.priority, speculative=request.speculative,
                                           grammar=request.grammar(index))
            group.request_ids.append(rid)
            self._streams[rid] = (group, index)
            self._unscheduled.add(rid)

    def _note_scheduled(self) -> None:
        """Free a queue slot for each admitted request that has now been scheduled."""
        self._scheduled([rid for rid in self._unscheduled if self.engine.requests[rid].first_scheduled_time])

    def _scheduled(self, request_ids: list[int]) -> None:
        self._unscheduled.difference_update(request_ids)
        self._release(len(request_ids))

    def _abort(self, request_id: int) -> None:
        if request_id in self._streams:
            self.engine.abort(request_id)
            self._retire(request_id)

    def _retire(self, request_id: int) -> None:
        """A request ended (finished, failed or aborted): count it, then keep nothing of it."""
        self._streams.pop(request_id, None)
        req = self.engine.requests.get(request_id)
        if req is not None and req.finished:
            self.metrics.request_finished(req)
        self.engine.forget(request_id)
        if request_id in self._unscheduled:  # ended while still queued (aborted, shut down)
            self._scheduled([request_id])

    def _fail_all(self, error: Exception) -> int:
        failed = list(self._streams)
        for rid in failed:
            self._deliver(rid, error)
            self._abort(rid)
        return len(failed)
