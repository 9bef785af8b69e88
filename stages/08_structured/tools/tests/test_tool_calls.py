"""From schemas to tool calls: every string of the call grammar is a call to an offered function
whose arguments validate; constrained generation on a tiny model always gives such calls; the lazy
grammar never masks text before the trigger and always masks after it; strict and best-effort
functions behave as response_format's schemas do, under the same budget."""
import json
import random
import re

import jsonschema
import numpy as np
import pytest
import torch

from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
from course.s08_structured.bench.testing import random_valid_path, sample_strings, synthetic_vocab
from course.s08_structured.budget import CompileBudget
from course.s08_structured.generate import ConstrainedGenerator
from course.s08_structured.grammar import GrammarError
from course.s08_structured.matcher import GrammarMatcher, compile_grammar
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.tools import (CLOSE, OPEN, SEPARATOR, Function, LazyGrammarLogitsProcessor, TriggerTokens,
                                         tool_call_grammar)
from course.s08_structured.vocab import TokenizerInfo

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 10},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 20},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                    "maxItems": 2}},
          "required": ["query", "limit"]}
FUNCTIONS = [Function("get_weather", WEATHER, strict=True), Function("search", SEARCH), Function("ping")]
SCHEMAS = {f.name: f.parameters for f in FUNCTIONS}
CALL = re.compile(re.escape(OPEN) + "(.*?)" + re.escape(CLOSE), re.S)


def calls_in(text: str) -> list[dict]:
    """The calls of a tagged answer, each checked against its function's schema."""
    calls = [json.loads(body) for body in CALL.findall(text)]
    assert CALL.sub("", text).strip(SEPARATOR) == ""  # nothing but calls
    for call in calls:
        assert set(call) == {"name", "arguments"}
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    return calls


@pytest.mark.parametrize("parallel", [False, True])
def test_every_string_of_the_call_grammar_is_a_valid_call(parallel):
    grammar = tool_call_grammar(FUNCTIONS, parallel=parallel)
    names = set()
    for text in sample_strings(grammar, random.Random(0), 150):
        calls = calls_in(text)
        assert len(calls) == 1 or parallel
        names |= {c["name"] for c in calls}
    assert names == set(SCHEMAS)  # the union reaches every function


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constrained_generation_gives_calls_that_validate(seed):
    tok, model = byte_tokenizer(), tiny_model("gqa_tied", seed=0)
    info = TokenizerInfo.from_huggingface(tok, model.config.vocab_size, stop_ids=[tok.eos_token_id])
    compiled = compile_grammar(tool_call_grammar(FUNCTIONS, parallel=True), info)
    out = run_to_end(ConstrainedGenerator(compiled, narrow=CloseOnBudget()), model, tok, tok("call:").input_ids,
                     SamplingParams(max_new_tokens=200, temperature=1.0, seed=seed), [tok.eos_token_id])
    assert out.finish_reason == "stop" and calls_in(out.text)


def lazy_vocab() -> TokenizerInfo:
    """A synthetic vocabulary with the trigger in pieces, whole, and straddling into JSON."""
    base = synthetic_vocab(seed=3, texts=('{"name": "get_weather", "arguments": {"city": "Rome"}}hello. ',))
    extra = [b"<tool", b"_call", b"<tool_call>", b">", b'>{"', b'>{"name": "ping', b">zz", b"l>x", b"call>{"]
    n = len(base.token_bytes)
    return TokenizerInfo(base.token_bytes + extra, base.stop_ids, base.special_ids), n


def allowed(processor, ids, vocab_size) -> np.ndarray:
    return torch.isfinite(processor(ids, torch.zeros(vocab_size))).numpy()


def test_lazy_grammar_never_masks_before_the_trigger_and_always_after():
    info, first_extra = lazy_vocab()
    compiled = compile_grammar(tool_call_grammar(FUNCTIONS, parallel=True, after_trigger=True), info)
    triggers = TriggerTokens(info)
    rng = random.Random(0)
    ids_of = {b: i for i, b in enumerate(info.token_bytes) if b}
    for trial in range(6):
        lazy = LazyGrammarLogitsProcessor(compiled, triggers)
        free = [rng.choice([i for i, b in enumerate(info.token_bytes) if b and b"<" not in b and b">" not in b])
                for _ in range(rng.randint(0, 12))]
        ids = []
        for tok in free + [ids_of[b"<tool"], ids_of[b"_call"]]:
            mask = allowed(lazy, ids, info.vocab_size)
            completing = set(triggers.completing[triggers.pending(lazy.text)].tolist())
            assert all(mask[t] for t in range(info.vocab_size) if t not in completing)  # never masked
            ids.append(tok)
        # the trigger's last piece: a token straddling into valid JSON is allowed, into invalid JSON masked
        mask = allowed(lazy, ids, info.vocab_size)
        assert mask[ids_of[b">"]] and mask[ids_of[b'>{"']] and mask[ids_of[b'>{"name": "ping']]
        assert not mask[ids_of[b">zz"]]
        ids.append(ids_of[b'>{"'] if trial % 2 else ids_of[b">"])
        # from the trigger on: exactly the call grammar's mask, step by step
        reference = GrammarMatcher(compiled)
        if trial % 2:
            assert reference.accept_string(b'{"')
        path = random_valid_path(_clone(reference), rng, max_tokens=40)
        for step in range(len(path) + 1):
            assert (allowed(lazy, ids + path[:step], info.vocab_size) == reference.next_token_mask()).all()
            if step < len(path):
                assert reference.accept_token(path[step])
        assert lazy.triggered


def _clone(matcher: GrammarMatcher) -> GrammarMatcher:
    twin = GrammarMatcher(matcher.compiled)
    twin._history = list(matcher._history)
    return twin


def test_lazy_grammar_follows_a_rollback():
    info, _ = lazy_vocab()
    compiled = compile_grammar(tool_call_grammar(FUNCTIONS, after_trigger=True), info)
    lazy = LazyGrammarLogitsProcessor(compiled)
    ids_of = {b: i for i, b in enumerate(info.token_bytes) if b}
    trigger = [ids_of[b"<tool_call>"]]
    allowed(lazy, trigger, info.vocab_size)
    assert lazy.triggered
    assert allowed(lazy, [], info.vocab_size).all() and not lazy.triggered
    assert lazy.valid_prefix([], trigger + [ids_of[b"zz"] if b"zz" in ids_of else ids_of[b"z"]]) == 1


def test_strict_functions_refuse_and_best_effort_ones_relax_naming_the_function():
    unique = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(GrammarError, match="'dedupe'.*uniqueItems"):
        tool_call_grammar([Function("dedupe", unique, strict=True)])
    grammar = tool_call_grammar([Function("dedupe", unique)])
    assert [w.pointer for w in grammar.warnings] == ["tools[dedupe]#/properties/ids"]


def test_the_budget_covers_all_functions_together():
    many = [Function(f"f{i}", {"type": "object", "properties": {f"p{j}": {"type": "integer"} for j in range(20)}})
            for i in range(600)]
    with pytest.raises(GrammarError, match="max_nodes"):
        tool_call_grammar(many, budget=CompileBudget())
    with pytest.raises(GrammarError, match="share a name"):
        tool_call_grammar([Function("a"), Function("a")])
