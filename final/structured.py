"""`response_format` for the server: JSON Schema -> grammar -> compiled grammar -> one logits
processor per choice (stage 08). Compiled grammars are cached by schema, since clients send the
same schema again and again. A compile builds the automaton only; each position's mask is made
the first time a request reaches it (stage 08's `precompute=False`) and kept in the compiled
grammar, for every later request of that schema: a new schema costs its first request tens of
milliseconds instead of the second or more precomputing every position takes here
(`python -m course.final.bench.schema_ttft`).

The JSON Schema front end is a room of stage 08 (json_schema/), so the cache is given it: a
plug-in sets `schema_grammar`, `(schema, strict, budget) -> Grammar` (cli.py's plugs in stage
08's `json_schema_to_grammar`); without one a `response_format` gets a 400 that says so. A
plug-in may also give `narrow`, each processor's mask narrower (stage 08's CloseOnBudget: the
JSON closes before max_tokens runs out: a valid document, finish_reason "length" if it was cut short).

A schema is the client's input, so what it may cost is bounded: stage 08's CompileBudget
refuses oversized or too-deep schemas at once and stops a compile at its deadline (both a 400
naming the limit). Compiles run on their own worker thread, so the event loop keeps serving,
and a compile whose client left, or that a shutdown interrupts, is cancelled, not finished.

Which keywords are enforced: OpenAI's `json_schema.strict: true` asks for output that follows
the schema exactly, so a schema with a keyword no grammar enforces (uniqueItems, ...) is
refused (400). Otherwise the compiler may be best-effort: enforce what it can, relax the rest,
and list what it relaxed in `grammar.warnings`, which the server sends in the response header
`x-structured-output-warnings` (a JSON list of {keyword, at, relaxed_to}), streamed or not.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from typing import Callable

import torch

from course.s08_structured.automaton import build_rule
from course.s08_structured.budget import CompileBudget, CompileCancelled
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.grammar import Grammar, lit
from course.s08_structured.mask_cache import classify_position
from course.s08_structured.matcher import CompiledGrammar, compile_grammar
from course.s08_structured.vocab import TokenizerInfo

from .engine_client import ShuttingDownError

ANY_OBJECT = {"type": "object"}
WARM_SCHEMA = {"type": "object", "properties": {t: {"type": t} for t in ("string", "number", "integer", "array")}}
WARNINGS_HEADER = "x-structured-output-warnings"


def cache_key(schema, strict: bool) -> str | None:
    """The mode and the schema as canonical JSON; None for a schema too deep to serialise (the
    compile refuses it)."""
    try:
        return ("strict " if strict else "best-effort ") + json.dumps(schema, sort_keys=True)
    except RecursionError:
        return None


def is_strict(response_format) -> bool:
    """`strict: true` (OpenAI's flag) refuses what cannot be enforced; anything else is best-effort."""
    fmt = response_format.json_schema
    return bool(fmt is not None and fmt.strict)


def warning_headers(processors) -> dict[str, str]:
    """The response header that lists what best-effort mode did not enforce ({} if nothing)."""
    compiled = processors[0].compiled if processors else None  # None: a thinking budget alone (reasoning/)
    warnings = compiled.grammar.warnings if compiled is not None else ()
    return {WARNINGS_HEADER: json.dumps([w.to_json() for w in warnings])} if warnings else {}


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], capacity: int = 32,
                 timeout_s: float | None = 20.0, precompute: bool = False):
        # given by a plug-in: the JSON Schema front end, each processor's mask narrower, how a
        # position's mask is made (stage 08's walk, or the same walk in C) and a rule's automaton
        self.schema_grammar: Callable[[dict | bool, bool, CompileBudget], Grammar] | None = None
        self.narrow = None
        self.classify, self.build_rule = classify_position, build_rule
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)
        self.capacity, self.timeout_s = capacity, timeout_s
        self.precompute = precompute  # True: every position's mask at compile time (the first request waits)
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
        # Merging equivalent positions (stage 08's minimize.py) pays when every position gets a
        # mask at compile time; made lazily, masks are few, and merging would be a third of the compile.
        compiled = compile_grammar(grammar, self.tokenizer_info(), precompute=self.precompute, minimize=self.precompute,
                                   budget=budget, classify=self.classify, build_rule=self.build_rule)
        if hasattr(self.classify, "walker"):  # the C walk's tables too, here on the compile's thread
            self.classify.walker(compiled.pda)
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled

    def tokenizer_info(self) -> TokenizerInfo:
        with self._lock:
            if self._info is None:
                self._info = TokenizerInfo.from_huggingface(self.tokenizer, self.vocab_size, self.stop_ids)
            return self._info

    def prepare(self) -> None:
        """Make the tables every grammar of this tokenizer uses (each token's bytes, the vocabulary
        matrix, the narrower's index of tokens by their bytes) now, at start-up, rather than in
        the first request that brings a schema: a grammar of two bytes, compiled and masked once."""
        compiled = compile_grammar(Grammar({"root": lit("{}")}, "root"), self.tokenizer_info(), precompute=False,
                                   classify=self.classify)
        GrammarLogitsProcessor(compiled, max_new_tokens=1, narrow=self.narrow)([], torch.zeros(self.vocab_size))
        if self.schema_grammar is not None:  # and the rules most schemas share, kept by a caching build_rule
            compile_grammar(self.schema_grammar(WARM_SCHEMA, False, CompileBudget()), self.tokenizer_info(),
                            precompute=False, minimize=False, build_rule=self.build_rule)

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
        With `max_tokens` (and a narrower) the processors close the JSON before it runs out."""
        if response_format is None or response_format.type == "text":
            return None
        if self.schema_grammar is None:
            raise ValueError("response_format: this server was started without a JSON Schema compiler")
        schema = ANY_OBJECT if response_format.type == "json_object" else response_format.json_schema.schema_
        strict, build = is_strict(response_format), self.schema_grammar
        compiled = await self.compiled(cache_key(schema, strict), lambda budget: build(schema, strict, budget))
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
