"""The seam between the server and any engine: `EngineClient`, and the one request it takes.

    server.py ──GenerationRequest──> EngineClient ──> AsyncEngine   (this process: the engine thread)
              <──(choice, TokenEvent)──           └─> RemoteEngine  (stage 07's worker processes)

The server knows an engine only through this file: its limits (context length, vocabulary,
EOS ids), what it refuses (an option it cannot honour, named, so the server answers 400 rather
than ignore it), admission (one queue bound, kept here for every engine), `submit` (a request in,
a stream of its choices' tokens out) and abort (closing that stream).
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import TokenEvent
from course.s04_continuous_batching.engine import QueueFullError

from .metrics import ServerMetrics


class ShuttingDownError(RuntimeError):
    """The server is shutting down: it admits nothing new, and stops what outlives the drain."""


class RequestFailedError(RuntimeError):
    """This request alone failed inside the engine (its neighbours went on)."""


@dataclass
class GenerationRequest:
    """One API request, as every engine takes it. OpenAI's `n` makes it several choices on one
    prompt: `params[i]` (its own seed) and `grammars[i]` belong to choice i."""
    prompt_ids: list[int]
    params: list[SamplingParams]
    priority: int = 0          # for the priority scheduling policy: lower first
    speculative: bool = True   # False: the engine never drafts for it (its neighbours may be drafted for)
    grammars: list | None = None  # one logits processor per choice (a response_format's token masks)
    constrained: bool = False  # a response_format or tool calls ask for a grammar (known before it is compiled)
    request_id: str = ""       # the id the API answers with (cmpl-..., chatcmpl-...)

    @property
    def n(self) -> int:
        return len(self.params)

    def grammar(self, index: int):
        return self.grammars[index] if self.grammars else None

    def sampling(self, index: int) -> SamplingParams:
        """Choice `index`'s sampling parameters, its grammar's mask among their logits processors."""
        params, grammar = self.params[index], self.grammar(index)
        if grammar is None:
            return params
        return dataclasses.replace(params, logits_processors=[*params.logits_processors, grammar])


@dataclass(frozen=True)
class EngineLimits:
    """What a server must know of the model behind an engine."""
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    architecture: str = ""  # the model's family as transformers names it, e.g. "Qwen3ForCausalLM"


class EventStream:
    """The (choice index, TokenEvent) pairs of one admitted request, as they come from `events`
    (an asyncio.Queue that may also carry an exception). `close()` (sync, idempotent) is the
    abort: it cancels whatever has not finished; call it when the client goes away."""

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

    async def aclose(self) -> None:
        self.close()

    def __del__(self):  # dropped without close(): never leave a request running for nobody
        self.close()

    def _cancel(self) -> None:
        raise NotImplementedError


class EngineClient(ABC):
    """What the server asks of an engine. Admission is decided here, on the caller's thread and
    at once: a refused request (400, 429, 503) never waits for an engine step."""
    counted = "waiting requests"  # what the queue bound counts, for the 429's message
    workers: dict[str, str] = {}  # name -> URL of each worker engine, where the engines are remote (dashboard/)

    def __init__(self, limits: EngineLimits, max_waiting: int, metrics: ServerMetrics | None = None):
        self.limits, self.max_waiting = limits, max_waiting
        self.metrics = metrics or ServerMetrics("model")
        self.accepting = True  # False once a shutdown began: nothing more is admitted
        self._waiting = 0      # requests admitted and counted against the bound
        self._waiting_lock = threading.Lock()
        self.refused = 0       # 429s so far (the dashboard shows them)

    # ---- admission: the one queue bound -------------------------------------------------------
    def check_room(self, n: int) -> None:
        """Raise what `submit` would for n more choices with the queue as it is now: a server
        calls it first, to refuse before it spends time tokenizing or compiling a schema."""
        if not self.accepting:
            raise ShuttingDownError("the server is shutting down and accepts no new requests")
        if n > self.max_waiting:
            raise ValueError(f"n={n} choices can never be admitted: this server queues at most "
                             f"{self.max_waiting} requests")
        if self._waiting + n > self.max_waiting:
            self.refused += 1
            raise QueueFullError(f"the queue is full ({self.max_waiting} {self.counted}); retry later")

    def _admit(self, n: int) -> None:
        """Count n choices against the bound, or raise as `check_room` does (atomically)."""
        with self._waiting_lock:
            self.check_room(n)
            self._waiting += n

    def _release(self, n: int) -> None:
        """n admitted choices no longer count (scheduled, finished or stopped)."""
        if n:
            with self._waiting_lock:
                self._waiting -= n

    # ---- what each engine implements ----------------------------------------------------------
    def start(self) -> "EngineClient":
        return self

    @abstractmethod
    def refuse(self, request: GenerationRequest) -> str | None:
        """Why this engine cannot run `request` as asked (the server answers 400), or None."""

    @abstractmethod
    def submit(self, request: GenerationRequest) -> EventStream:
        """Admit all of the request's choices or none, and return their stream. Raises at once,
        queueing nothing: ShuttingDownError, ValueError (can never run), QueueFullError."""

    @abstractmethod
    def drain(self, timeout: float, hurry: threading.Event | None = None) -> int:
        """Admit nothing more, let what is in flight finish for up to `timeout` seconds (or until
        `hurry` is set), then stop the rest with ShuttingDownError. Returns how many were stopped."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop at once; whatever is still in flight ends with ShuttingDownError."""
