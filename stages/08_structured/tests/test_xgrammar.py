"""Our masks equal xgrammar's (the outside reference) on the real 49,152-token vocabulary, at
every step of random valid outputs, for JSON schemas (each side's own schema converter),
regexes (each side's own regex parser) and EBNF grammars (the same text).

xgrammar leaves SmolLM2's special tokens (<|im_start|>, ...) to its ordinary-text rules; we
never allow them, so those ids are compared separately. xgrammar's length-bounded strings and dates
differ from JSON's (bench/testing.py: xgrammar_comparable), so schemas are compared without them."""
import random

import numpy as np
import pytest

from course.s08_structured.bench.testing import (EXAMPLE_EBNF, EXAMPLE_REGEXES, EXAMPLE_SCHEMAS, random_valid_path,
                                                 xgrammar_comparable, xgrammar_compile, xgrammar_mask)
from course.s08_structured.frontends.ebnf import parse_ebnf
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import GrammarMatcher, compile_grammar

CASES = ([("json_schema", n) for n in EXAMPLE_SCHEMAS] + [("regex", n) for n in EXAMPLE_REGEXES]
         + [("ebnf", n) for n in EXAMPLE_EBNF])


def ours(kind, name):
    if kind == "json_schema":
        return json_schema_to_grammar(source(kind, name))
    if kind == "regex":
        return regex_to_grammar(EXAMPLE_REGEXES[name])
    return parse_ebnf(EXAMPLE_EBNF[name])


def source(kind, name):
    if kind == "json_schema":
        return xgrammar_comparable(EXAMPLE_SCHEMAS[name])   # see bench/testing.py
    return {"regex": EXAMPLE_REGEXES, "ebnf": EXAMPLE_EBNF}[kind][name]


@pytest.mark.slow
@pytest.mark.parametrize("kind,name", CASES)
def test_masks_equal_xgrammar_at_every_step(kind, name, smollm2_xgrammar, smollm2_info):
    import xgrammar as xgr

    vocab = smollm2_info.vocab_size
    compiled = compile_grammar(ours(kind, name), smollm2_info)
    x_compiled = xgrammar_compile(smollm2_xgrammar, source(kind, name), kind)
    special = sorted(smollm2_info.special_ids)
    rng = random.Random(name)
    steps = 0
    for walk in range(3):
        path = random_valid_path(GrammarMatcher(compiled), rng, max_tokens=40, end_bias=0.5)
        mine, theirs = GrammarMatcher(compiled), xgr.GrammarMatcher(x_compiled)
        for t in path + [None]:
            if t is None and mine.is_terminated():
                break
            a, b = mine.next_token_mask(), xgrammar_mask(theirs, vocab)
            assert not a[special].any()
            a[special] = b[special] = False
            diff = np.flatnonzero(a != b)
            assert not diff.size, (f"walk {walk} step {mine.num_accepted}: {len(diff)} tokens differ, e.g. "
                                   f"{[(int(i), smollm2_info.token_bytes[i], bool(a[i])) for i in diff[:5]]}")
            steps += 1
            if t is None:
                break
            assert mine.accept_token(t) and theirs.accept_token(t)
        assert mine.is_terminated() == theirs.is_terminated()
    assert steps >= 10
