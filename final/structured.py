"""`response_format` for the server: JSON Schema -> compiled grammar -> one logits processor per
choice (stage 08). Compiled grammars are cached by schema, since clients send the same schema
again and again and compiling precomputes masks over the whole vocabulary (seconds here)."""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict

from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import CompiledGrammar, compile_grammar
from course.s08_structured.vocab import TokenizerInfo

ANY_OBJECT = {"type": "object"}


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], capacity: int = 32):
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)
        self.capacity = capacity
        self._info: TokenizerInfo | None = None
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()   # compiles run in worker threads, several at once

    def compile(self, schema) -> CompiledGrammar:
        """Compile (or fetch) a schema; GrammarError (a ValueError) if it is malformed or unsupported."""
        key = json.dumps(schema, sort_keys=True)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            if self._info is None:
                self._info = TokenizerInfo.from_huggingface(self.tokenizer, self.vocab_size, self.stop_ids)
        grammar = json_schema_to_grammar(schema)        # errors surface before the slow part
        compiled = compile_grammar(grammar, self._info)  # outside the lock: other schemas go on
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled

    async def processors(self, response_format, n: int) -> list[GrammarLogitsProcessor] | None:
        """None for plain text; else n fresh processors sharing one compiled grammar. Compiling
        runs in a worker thread so the event loop keeps serving other requests meanwhile."""
        if response_format is None or response_format.type == "text":
            return None
        schema = ANY_OBJECT if response_format.type == "json_object" else response_format.json_schema.schema_
        compiled = await asyncio.to_thread(self.compile, schema)
        return [GrammarLogitsProcessor(compiled) for _ in range(n)]
