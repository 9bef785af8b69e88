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
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from course.s08_structured.budget import CompileBudget, CompileCancelled
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.json_schema import BEST_EFFORT, STRICT, json_schema_to_grammar
from course.s08_structured.matcher import CompiledGrammar, compile_grammar
from course.s08_structured.vocab import TokenizerInfo

from .async_engine import ShuttingDownError

ANY_OBJECT = {"type": "object"}
WARNINGS_HEADER = "x-structured-output-warnings"


def cache_key(schema, mode: str = BEST_EFFORT) -> str | None:
    """The mode and the schema as canonical JSON; None for a schema too deep to serialise (the
    compile refuses it)."""
    try:
        return mode + " " + json.dumps(schema, sort_keys=True)
    except RecursionError:
        return None


def mode_of(response_format) -> str:
    """`strict: true` (OpenAI's flag) refuses what cannot be enforced; anything else is best-effort."""
    fmt = response_format.json_schema
    return STRICT if fmt is not None and fmt.strict else BEST_EFFORT


def warning_headers(processors) -> dict[str, str]:
    """The response header that lists what best-effort mode did not enforce ({} if nothing)."""
    warnings = processors[0].matcher.compiled.grammar.warnings if processors else ()
    return {WARNINGS_HEADER: json.dumps([w.to_json() for w in warnings])} if warnings else {}


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], capacity: int = 32,
                 timeout_s: float | None = 20.0):
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)
        self.capacity, self.timeout_s = capacity, timeout_s
        self._info: TokenizerInfo | None = None
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()   # the cache is read on the loop and written by the worker
        # One worker: two hostile schemas cannot take both cores from the engine. A queued
        # compile's deadline runs while it waits, so a burst of them is answered in bounded time.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._live: dict[int, CompileBudget] = {}   # compiles queued or running, to cancel at shutdown

    def compile(self, schema, budget: CompileBudget | None = None, mode: str = BEST_EFFORT) -> CompiledGrammar:
        """Compile (or fetch) a schema. GrammarError (a ValueError) if it is malformed, unsupported
        (strict mode) or past the budget's limits; CompileCancelled if the budget was cancelled."""
        grammar = json_schema_to_grammar(schema, budget=budget, mode=mode)  # limits are checked here, fast
        key = cache_key(schema, mode)
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

    async def processors(self, response_format, n: int) -> list[GrammarLogitsProcessor] | None:
        """None for plain text; else n fresh processors sharing one compiled grammar. A schema seen
        before is answered from the cache on the event loop, never queued behind a compile."""
        if response_format is None or response_format.type == "text":
            return None
        schema = ANY_OBJECT if response_format.type == "json_object" else response_format.json_schema.schema_
        mode = mode_of(response_format)
        compiled = self.cached(cache_key(schema, mode)) or await self._compile_off_loop(schema, mode)
        return [GrammarLogitsProcessor(compiled) for _ in range(n)]

    async def _compile_off_loop(self, schema, mode: str) -> CompiledGrammar:
        budget = CompileBudget(timeout_s=self.timeout_s)  # its clock starts now: queueing counts
        self._live[id(budget)] = budget
        try:
            return await asyncio.wrap_future(self._pool.submit(self.compile, schema, budget, mode))
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
