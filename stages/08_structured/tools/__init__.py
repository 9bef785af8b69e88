"""From schemas to tool calls: the grammar of a tagged call to one of several functions
(calls.py) and a lazy grammar that lets free text run until a call begins (lazy.py).
(Absolute imports: pytest imports this file on its own when it collects the tests below it.)"""
from course.s08_structured.tools.calls import CLOSE, OPEN, SEPARATOR, Function, tool_call_grammar
from course.s08_structured.tools.lazy import LazyGrammarLogitsProcessor, TriggerTokens, pending_prefix

__all__ = ["CLOSE", "OPEN", "SEPARATOR", "Function", "LazyGrammarLogitsProcessor", "TriggerTokens", "pending_prefix",
           "tool_call_grammar"]
