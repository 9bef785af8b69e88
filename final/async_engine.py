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


class EngineDeadError(RuntimeError):
    """The engine loop failed; the request could not be completed."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
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
        """Stream a request's tokens. Admission errors (too long, queue full) are raised before
        the first token; if the consumer stops early (a client disconnects), the request is
        aborted and its KV blocks are freed."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        admitted: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("add", prompt_ids, params, loop, events, admitted))
        request_id = await asyncio.wrap_future(admitted)
        finished = False
        try:
            while not finished:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                self._commands.put(("abort", request_id))

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._handle_commands(block=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # keep serving: fail the requests in flight, not the server
                self._fail_all(EngineDeadError(f"engine step failed: {type(e).__name__}: {e}"))
                continue
            for out in outputs:
                if out.request_id in self._streams:
                    self._deliver(out.request_id, out.event)
                if out.event.finish_reason:
                    self._streams.pop(out.request_id, None)
                    self.engine.forget(out.request_id)

    def _deliver(self, request_id: int, item) -> None:
        loop, events = self._streams[request_id]
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
                _, prompt_ids, params, loop, events, admitted = cmd
                try:
                    rid = self.engine.add_request(prompt_ids, params)
                except Exception as e:  # refused: the caller turns it into a 4xx
                    admitted.set_exception(e)
                else:
                    self._streams[rid] = (loop, events)
                    admitted.set_result(rid)
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

    def _abort(self, request_id: int) -> None:
        self.engine.abort(request_id)
        self.engine.forget(request_id)
        self._streams.pop(request_id, None)

    def _fail_all(self, error: Exception) -> None:
        for rid in list(self._streams):
            self._deliver(rid, error)
            self._abort(rid)

    def call(self, fn):
        """Run `fn(engine)` on the engine thread and return its result (for stats, tests)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, done))
        return done.result(timeout=30)
