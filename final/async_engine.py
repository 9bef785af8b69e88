"""The engine loop in its own thread, with an asyncio face for the server.

The model's forward pass blocks for tens of milliseconds; run on the event loop, it would
freeze every connection. So one thread owns the LLMEngine and does nothing but `step()`;
the server's coroutines talk to it through a command queue (add, abort, call) and get their
tokens back through one asyncio.Queue per request. Only the engine thread ever touches the
engine's state, so the engine needs no locks.

Admission is decided on the caller's thread, at once: `submit` checks the prompt, the
context and the queue bound and raises before anything is queued, so a refused request (400,
429, 503) never waits for an engine step. The queue bound counts requests admitted but not
yet scheduled, under a small lock shared by the two threads.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s04_continuous_batching.engine import LLMEngine, QueueFullError

from .engine import Engine
from .metrics import ServerMetrics


class EngineDeadError(RuntimeError):
    """The engine step failed; every request in flight could not be completed."""


class RequestFailedError(RuntimeError):
    """This request alone failed inside the engine (its neighbours went on)."""


class ShuttingDownError(RuntimeError):
    """The server is shutting down: it admits nothing new, and stops what outlives the drain."""


@dataclass(eq=False)
class _Group:
    """One API request: its n sequences (OpenAI's `n`) and where their tokens go."""
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    seqs: list[Sequence]
    speculative: bool = True  # False: the engine never drafts for these sequences
    priority: int = 0         # for the priority scheduling policy: lower first
    request_ids: list[int] = field(default_factory=list)  # filled by the engine thread


class EventStream:
    """The (index, TokenEvent) pairs of one admitted request, as they come from `events` (an
    asyncio.Queue that may also carry an exception). `close()` (sync, idempotent) cancels
    whatever has not finished: call it when the client goes away. Subclasses say how to cancel."""

    def __init__(self, events: asyncio.Queue, num_choices: int):
        self._events = events
        self._running = set(range(num_choices))

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> tuple[int, TokenEvent]:
        if not self._running:
            raise StopAsyncIteration
        item = await self._events.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        index, event = item
        if event.finish_reason is not None:
            self._running.discard(index)
        return index, event

    def close(self) -> None:
        if self._running:
            self._running.clear()
            self._cancel()

    def _cancel(self) -> None:
        raise NotImplementedError


class RequestStream(EventStream):
    """An EventStream of the local engine: closing it aborts the request on the engine thread
    and frees its KV blocks."""

    def __init__(self, engine: "AsyncEngine", group: _Group):
        super().__init__(group.events, len(group.seqs))
        self._engine, self._group = engine, group

    def _cancel(self) -> None:
        self._engine._commands.put(("abort", self._group))

    async def aclose(self) -> None:
        self.close()

    def __del__(self):  # dropped without close(): never leave a request running for nobody
        self.close()


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None):
        self.engine, self.metrics = engine, metrics or ServerMetrics("model")
        self.max_waiting = engine.config.max_waiting
        self.accepting = True  # False once a shutdown began: submit() refuses with ShuttingDownError
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[int, tuple[_Group, int]] = {}  # request id -> (its group, its index)
        self._unscheduled: set[int] = set()  # engine thread: admitted ids not yet scheduled once
        self._waiting = 0                    # how many admitted requests are not scheduled yet
        self._waiting_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

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
    def submit(self, prompt_ids: list[int], params: list[SamplingParams], speculative: bool = True,
               priority: int = 0) -> RequestStream:
        """Admit one request per entry of `params` on the same prompt (OpenAI's `n`), all or
        none, and return their stream. Raises at once, queueing nothing: ShuttingDownError,
        ValueError (empty prompt, n beyond the queue bound), CacheCapacityError (too long for
        the context or the whole KV pool; a ValueError too), QueueFullError. `speculative=False`:
        never drafted for (an engine that does not speculate has nothing to switch off)."""
        seqs = [self.engine.make_sequence(prompt_ids, p) for p in params]  # reads fixed sizes only
        with self._waiting_lock:
            self.check_room(len(seqs))
            self._waiting += len(seqs)
        group = _Group(asyncio.get_running_loop(), asyncio.Queue(), seqs, speculative, priority)
        self._commands.put(("add", group))
        return RequestStream(self, group)

    def check_room(self, n: int) -> None:
        """Raise what `submit` would for n more requests with the queue as it is now: a server
        calls it first, to refuse before it spends time tokenizing or compiling a schema."""
        if not self.accepting:
            raise ShuttingDownError("the server is shutting down and accepts no new requests")
        if n > self.max_waiting:
            raise ValueError(f"n={n} choices can never be admitted: this server queues at most "
                             f"{self.max_waiting} requests")
        if self._waiting + n > self.max_waiting:
            raise QueueFullError(f"the queue is full ({self.max_waiting} waiting requests); retry later")

    async def generate_many(self, prompt_ids: list[int],
                            params: list[SamplingParams]) -> AsyncIterator[tuple[int, TokenEvent]]:
        """`submit` as an async generator: admission errors raise at the first `anext`."""
        stream = self.submit(prompt_ids, params)
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
        """Graceful shutdown, called from any thread but the engine's: admit nothing more, let
        the requests in flight finish for up to `timeout` seconds (or until `hurry` is set),
        then stop the rest with ShuttingDownError. Returns how many were stopped."""
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
        for index, seq in enumerate(group.seqs):
            rid = self._add_sequence(seq, group.speculative, group.priority)  # admitted already: cannot be refused
            group.request_ids.append(rid)
            self._streams[rid] = (group, index)
            self._unscheduled.add(rid)

    def _add_sequence(self, seq: Sequence, speculative: bool, priority: int) -> int:
        """Only final's Engine drafts, so only it takes the switch (stage 04's serves some tests)."""
        if isinstance(self.engine, Engine):
            return self.engine.add_sequence(seq, priority, speculative=speculative)
        return self.engine.add_sequence(seq, priority)

    def _note_scheduled(self) -> None:
        """Free a queue slot for each admitted request that has now been scheduled."""
        self._release([rid for rid in self._unscheduled if self.engine.requests[rid].first_scheduled_time])

    def _release(self, request_ids: list[int]) -> None:
        if request_ids:
            self._unscheduled.difference_update(request_ids)
            with self._waiting_lock:
                self._waiting -= len(request_ids)

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
            self._release([request_id])

    def _fail_all(self, error: Exception) -> int:
        failed = list(self._streams)
        for rid in failed:
            self._deliver(rid, error)
            self._abort(rid)
        return len(failed)
