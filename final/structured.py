"""`response_format` for the server: JSON Schema -> compiled grammar -> one logits processor per
choice (stage 08). Compiled grammars are cached by schema, since clients send the same schema
again and again and compiling precomputes masks over the whole vocabulary (seconds here).

A schema is the client's input, so what it may cost is bounded: stage 08's CompileBudget
refuses oversized or too-deep schemas at once and stops a compile at its deadline (both a 400
naming the limit). Compiles run on their own worker thread, so the event loop keeps serving,
and a compile whose client left, or that a shutdown interrupts, is cancelled, not finished.

Which keywords are enforced: OpenAI's `json_schema.strict: true` asks for output that follows
the schema exactly, so a schema with a keyword no grammar enforces (uniqueItems, ...) is
refused (400, stage 08's strict mode). Otherwise the server is best-effort: it enforces what it
can, relaxes the rest, and says what it relaxed in the response header
`x-structured-output-warnings` (a JSON list of {keyword, at, relaxed_to}), streamed or not.

Answers that finish: in best-effort mode, strings, numbers and arrays the schema
leaves unbounded get serving defaults (stage 08's SERVING_BOUNDS: 64 characters, 16 digits,
16 items; each one applied is listed in the same header, kind "default-bound"), and every
processor closes on budget: when the tokens left in max_tokens are about what the shortest
way to close the JSON needs, only tokens that still let it close are allowed, so the answer
ends with finish_reason "stop" instead of being cut ("length" still means it was cut). Strict
mode gets neither bounds nor any change to its language; it does close on budget.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from course.s08_structured.budget import CompileBudget, CompileCancelled
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.json_schema import BEST_EFFORT, SERVING_BOUNDS, STRICT, DefaultBounds, json_schema_to_grammar
from course.s08_structured.matcher import CompiledGrammar, compile_grammar
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.vocab import TokenizerInfo

from .engine_client import ShuttingDownError

ANY_OBJECT = {"type": "object"}
WARNINGS_HEADER = "x-structured-output-warnings"


def cache_key(schema, mode: str = BEST_EFFORT, bounds: DefaultBounds | None = None) -> str | None:
    """The mode, the default bounds and the schema as canonical JSON; None for a schema too deep
    to serialise (the compile refuses it)."""
    try:
        return mode + " " + json.dumps(bounds.to_json() if bounds and mode == BEST_EFFORT else None) + " " + \
            json.dumps(schema, sort_keys=True)
    except RecursionError:
        return None


def mode_of(response_format) -> str:
    """`strict: true` (OpenAI's flag) refuses what cannot be enforced; anything else is best-effort."""
    fmt = response_format.json_schema
    return STRICT if fmt is not None and fmt.strict else BEST_EFFORT


def warning_headers(processors) -> dict[str, str]:
    """The response header that lists what best-effort mode did not enforce ({} if nothing)."""
    warnings = processors[0].compiled.grammar.warnings if processors else ()
    return {WARNINGS_HEADER: json.dumps([w.to_json() for w in warnings])} if warnings else {}


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], capacity: int = 32,
                 timeout_s: float | None = 20.0, default_bounds: DefaultBounds | None = SERVING_BOUNDS,
                 close_on_budget: bool = True):
        self.default_bounds, self.close_on_budget = default_bounds, close_on_budget
        self.narrow = CloseOnBudget() if close_on_budget else None   # each processor's mask narrower
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)
        self.capacity, self.timeout_s = capacity, timeout_s
        self._info: TokenizerInfo | None = None
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()   # the cache is read on the loop and written by the worker
        # One worker: two hostile schemas cannot take both cores from the engine. A queued
        # compile's deadline runs while it waits, so a burst of them is answered in bounded time.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._live: dict[int, CompileBudget] = {}   # compiles queued or running, to cancel at shutdown

    def compile(self, key: str | None, budget: CompileBudget | None, build) -> CompiledGrammar:
        """Compile (or fetch) the grammar `build(budget)` makes (a schema's, or tools/' calls). GrammarError
        (a ValueError) if it is malformed, unsupported (strict mode) or past the budget's limits;
        CompileCancelled if the budget was cancelled."""
        grammar = build(budget)  # the limits are checked here, fast
        if (hit := self.cached(key)) is not None:
            return hit
        with self._lock:
            if self._info is None:
                self._info = TokenizerInfo.from_huggingface(self.tokenizer, self.vocab_size, self.stop_ids)
        compiled = compile_grammar(grammar, self._info, budget=budget)
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled

    def cached(self, key: str | None) -> CompiledGrammar | None:
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        return None

    async def processors(self, response_format, n: int,
                         max_tokens: int | None = None) -> list[GrammarLogitsProcessor] | None:
        """None for plain text; else n fresh processors sharing one compiled grammar. A schema seen
        before is answered from the cache on the event loop, never queued behind a compile.
        With `max_tokens` (and close_on_budget) the processors close the JSON before it runs out."""
        if response_format is None or response_format.type == "text":
            return None
        schema = ANY_OBJECT if response_format.type == "json_object" else response_format.json_schema.schema_
        mode = mode_of(response_format)
        key = cache_key(schema, mode, self.default_bounds)
        compiled = await self.compiled(key, lambda b: json_schema_to_grammar(  # bounds: best-effort only
            schema, budget=b, mode=mode, default_bounds=self.default_bounds))
        return [GrammarLogitsProcessor(compiled, max_new_tokens=max_tokens, narrow=self.narrow) for _ in range(n)]

    async def compiled(self, key: str | None, build) -> CompiledGrammar:
        """The grammar `build(budget)` makes, from the cache or compiled on the worker thread."""
        if (hit := self.cached(key)) is not None:
            return hit
        budget = CompileBudget(timeout_s=self.timeout_s)  # its clock starts now: queueing counts
        self._live[id(budget)] = budget
        try:
            return await asyncio.wrap_future(self._pool.submit(self.compile, key, budget, build))
        except asyncio.CancelledError:  # the client went away: stop the compile, not just the wait
            budget.cancel()
            raise
        except CompileCancelled:
            raise ShuttingDownError("the server is shutting down; the schema was not compiled") from None
        finally:
            self._live.pop(id(budget), None)

    def cancel_all(self) -> None:
        """Shutting down: stop every compile, queued or running."""
        for budget in list(self._live.values()):
            budget.cancel()
