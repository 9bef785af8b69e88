"""The grammar each choice is held to when tools are offered (stage 08's tools/), compiled and
cached by the server's GrammarCache, under the same budget and deadline as `response_format`:

    required   the whole answer is tagged calls to any offered function (several, newline-separated,
               if parallel_tool_calls), each function's arguments compiled from its schema,
               strict (`"strict": true`, refusing what cannot be enforced) or best-effort (relaxed,
               reported in the x-structured-output-warnings header, serving default bounds)
    named      one call to that function
    auto       a lazy grammar: free text until `<tool_call>`, the call grammar from there on
    none       no grammar (and `response_format` as usual)
"""
from __future__ import annotations

import asyncio
import json

from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.json_schema import SERVING_BOUNDS
from course.s08_structured.tools import Function, LazyGrammarLogitsProcessor, TriggerTokens, tool_call_grammar
from course.s08_structured.tools.calls import NO_PARAMETERS

_TRIGGERS: dict[int, tuple[object, TriggerTokens]] = {}  # per vocabulary (kept alive with it)


def functions_of(body) -> list[Function]:
    named = body.tool_choice.function.name if body.tool_mode() == "named" else None
    return [Function(t.function.name, NO_PARAMETERS if t.function.parameters is None else t.function.parameters,
                     bool(t.function.strict)) for t in body.tools if named in (None, t.function.name)]


def trigger_tokens(info) -> TriggerTokens:
    if id(info) not in _TRIGGERS:
        _TRIGGERS[id(info)] = (info, TriggerTokens(info))
    return _TRIGGERS[id(info)][1]


async def call_grammars(cache, body, n: int, max_tokens: int) -> list:
    """One logits processor per choice of a request that may call tools (auto, required, named).
    `cache`: the server's GrammarCache (its narrower closes the calls before max_tokens runs out)."""
    mode = body.tool_mode()
    functions = functions_of(body)
    parallel, lazy = body.parallel_tool_calls and mode != "named", mode == "auto"
    try:
        key = "tools " + json.dumps([[f.name, f.parameters, f.strict] for f in functions], sort_keys=True) + \
              f" {parallel} {lazy}"
    except RecursionError:
        key = None  # too deep to serialise: the compile refuses it by its depth limit
    compiled = await cache.compiled(key, lambda budget: tool_call_grammar(
        functions, parallel=parallel, after_trigger=lazy, budget=budget, default_bounds=SERVING_BOUNDS))
    if not lazy:
        return [GrammarLogitsProcessor(compiled, max_new_tokens=max_tokens, narrow=cache.narrow)
                for _ in range(n)]
    triggers = await asyncio.to_thread(trigger_tokens, compiled.info)
    return [LazyGrammarLogitsProcessor(compiled, triggers, max_new_tokens=max_tokens,
                                       narrow=cache.narrow) for _ in range(n)]
