"""The engine loop in its own thread, with an asyncio face for the server.

The model's forward pass blocks for tens of milliseconds; run on the event loop, it would
freeze every connection. So one thread owns the LLMEngine and does nothing but
`step()`; the server's coroutines talk to it through a command queue (add, abort) and get
their tokens back through one asyncio.Queue per request. Only the engine thread ever touches
the engine's state, so the engine needs no locks.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import TokenEvent
from course.s04_continuous_batching.engine import LLMEngine

from .metrics import ServerMetrics


class EngineDeadError(RuntimeError):
    """The engine loop failed; the request could not be completed."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None):
        self.engine, self.metrics = engine, metrics or ServerMetrics("model")
        self._commands: queue.Queue = queue.Queue()
        # request id -> (the consumer's event loop, its queue, the request's index among its siblings)
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "AsyncEngine":
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join(timeout=10)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        """Stream one request's tokens (see `generate_many`)."""
        async for _, event in self.generate_many(prompt_ids, [params]):
            yield event

    async def generate_many(self, prompt_ids: list[int],
                            params: list[SamplingParams]) -> AsyncIterator[tuple[int, TokenEvent]]:
        """Run one request per entry of `params` on the same prompt (OpenAI's `n`) and stream
        (index, token) pairs as they come. All are admitted or none: admission errors (too
        long, queue full) are raised before the first token. If the consumer stops early (a
        client disconnects), the unfinished ones are aborted and their KV blocks freed."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        admitted: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("add", prompt_ids, list(params), loop, events, admitted))
        try:
            request_ids = await asyncio.shield(asyncio.wrap_future(admitted))
        except asyncio.CancelledError:  # gone before admission: abort whatever gets admitted
            admitted.add_done_callback(self._abort_when_admitted)
            raise
        running = set(range(len(request_ids)))
        try:
            while running:
                item = await events.get()
                if isinstance(item, BaseException):
                    raise item
                index, event = item
                if event.finish_reason is not None:
                    running.discard(index)
                yield index, event
        finally:
            for index in running:
                self._commands.put(("abort", request_ids[index]))

    def _abort_when_admitted(self, admitted: concurrent.futures.Future) -> None:
        if admitted.exception() is None:
            for rid in admitted.result():
                self._commands.put(("abort", rid))

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._handle_commands(block=not self.engine.has_unfinished())
            if self.engine.has_unfinished():
                self._step()
            self.metrics.engine_updated(self.engine)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # keep serving: fail the requests in flight, not the server
            self._fail_all(EngineDeadError(f"engine step failed: {type(e).__name__}: {e}"))
            return
        for out in outputs:
            if out.request_id in self._streams:
                self._deliver(out.request_id, out.event)
            if out.event.finish_reason:
                self._retire(out.request_id)

    def _deliver(self, request_id: int, event) -> None:
        loop, events, index = self._streams[request_id]
        item = event if isinstance(event, BaseException) else (index, event)
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self._abort(request_id)

    def _handle_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd[0] == "add":
                self._add(*cmd[1:])
            elif cmd[0] == "abort":
                self._abort(cmd[1])
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

    def _add(self, prompt_ids, params_list, loop, events, admitted) -> None:
        request_ids = []
        try:
            for params in params_list:
                request_ids.append(self.engine.add_request(prompt_ids, params))
        except Exception as e:  # refused: undo the siblings already queued; the caller answers 4xx
            for rid in request_ids:
                self.engine.abort(rid)
                self.engine.forget(rid)
            admitted.set_exception(e)
            return
        for index, rid in enumerate(request_ids):
            self._streams[rid] = (loop, events, index)
        admitted.set_result(request_ids)

    def _abort(self, request_id: int) -> None:
        if request_id in self._streams:
            self.engine.abort(request_id)
            self._retire(request_id)

    def _retire(self, request_id: int) -> None:
        """A request ended (finished or aborted): count it, then keep nothing of it."""
        self._streams.pop(request_id, None)
        req = self.engine.requests.get(request_id)
        if req is not None and req.finished:
            self.metrics.request_finished(req)
        self.engine.forget(request_id)

    def _fail_all(self, error: Exception) -> None:
        for rid in list(self._streams):
            self._deliver(rid, error)
            self._abort(rid)

    def call(self, fn):
        """Run `fn(engine)` on the engine thread and return its result (for stats, tests)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, done))
        return done.result(timeout=30)
