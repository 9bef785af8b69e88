"""The engine's own thread. The engine is not thread-safe, so it is touched only here: HTTP
handlers hand it functions to run (`submit`) and get their results through Futures, and each
request's step outputs go to the listener its handler registered.

One turn of the loop: run what was submitted, do the transfer work (engine.service_kv), step
the engine if anything is waiting or running, deliver the outputs, then call each `after_turn`
hook with the engine (the assembled worker hangs stage 04's watch there: snapshots while someone
reads them, nothing when nobody does).
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Callable, Iterable

from .engine import DisaggEngine

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, engine: DisaggEngine, idle_wait_s: float = 0.005,
                 after_turn: Iterable[Callable[[DisaggEngine], None]] = ()):
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self.listeners: dict[int, Callable] = {}  # request id -> called (on this thread) with each StepOutput
        self.after_turn = list(after_turn)  # called (on this thread) with the engine after every turn
        self._calls: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def running(self) -> bool:
        return not self._stop.is_set()

    def submit(self, fn: Callable[[DisaggEngine], object]) -> Future:
        """Run fn(engine) on the engine thread; the Future holds its result or its exception."""
        future: Future = Future()
        self._calls.put((fn, future))
        return future

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.has_unfinished()
            try:  # wait for work only when there is nothing to step
                self._call(*self._calls.get(timeout=0 if busy else self.idle_wait_s))
            except queue.Empty:
                pass
            while not self._calls.empty():
                self._call(*self._calls.get_nowait())
            try:  # transfers and steps fail separately: a broken side channel must not stop decoding
                self.engine.service_kv()
            except Exception:
                log.exception("KV transfer service failed")
            try:
                outputs = self.engine.step() if self.engine.has_unfinished() else []
            except Exception:  # a bug must not kill the worker silently: log it and go on
                log.exception("engine step failed")
                continue
            for out in outputs:
                listener = self.listeners.get(out.request_id)
                if listener:
                    listener(out)
            for hook in self.after_turn:
                try:
                    hook(self.engine)
                except Exception:  # a hook's bug (a snapshot's, say) must not stop the engine
                    log.exception("after-turn hook %r failed", hook)

    def _call(self, fn, future: Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(self.engine))
            except Exception as e:
                future.set_exception(e)
