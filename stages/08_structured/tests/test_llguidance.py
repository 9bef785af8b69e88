"""Our masks against llguidance's (the second outside reference: masks computed lazily by a lexer
and an Earley parser) on the real 49,152-token vocabulary, at every step of random valid outputs,
for the same ten grammars as xgrammar's comparison.

The two differ by design where the grammar *forces* the next bytes: llguidance then allows only
the tokens the tokenizer itself would write for them (its fast-forward: after `{"` with "id"
forced, `id` but not `i`), where ours allows every token that spells a part of them. So at each
step llguidance's mask must lie inside ours, and each token only ours allows must spell a
proper prefix of the bytes llguidance says are forced. Known differences in what JSON allows are
taken out on both sides, each named below."""
import random

import numpy as np
import pytest

from course.s08_structured.bench.testing import (EXAMPLE_EBNF, EXAMPLE_REGEXES, EXAMPLE_SCHEMAS, llguidance_comparable,
                                                 llguidance_mask, llguidance_matcher, random_valid_path,
                                                 xgrammar_comparable)
from course.s08_structured.frontends.ebnf import parse_ebnf
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import GrammarMatcher, compile_grammar

CASES = ([("json_schema", n) for n in EXAMPLE_SCHEMAS] + [("regex", n) for n in EXAMPLE_REGEXES]
         + [("ebnf", n) for n in EXAMPLE_EBNF])


def source(kind, name):
    if kind == "json_schema":  # without length bounds and formats, as xgrammar's comparison
        return llguidance_comparable(xgrammar_comparable(EXAMPLE_SCHEMAS[name]))
    return {"regex": EXAMPLE_REGEXES, "ebnf": EXAMPLE_EBNF}[kind][name]


def ours(kind, name):
    return {"json_schema": json_schema_to_grammar, "regex": regex_to_grammar, "ebnf": parse_ebnf}[kind](source(kind, name))


def known_differences(text: bytes, token_bytes: list[bytes], kind: str) -> np.ndarray:
    """[vocab] bool: tokens the two may judge differently after `text` for what JSON allows:
    DEL (0x7f), which JSON strings may hold raw and llguidance refuses; and `-0`, which JSON
    allows and ours refuses (as xgrammar does: one spelling of zero)."""
    out = np.zeros(len(token_bytes), dtype=bool)
    if kind != "json_schema":
        return out
    for i, b in enumerate(token_bytes):
        out[i] = b"\x7f" in b or (text.endswith(b"-") and b.startswith(b"0"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind,name", CASES)
def test_masks_agree_with_llguidance_at_every_step(kind, name, smollm2_llguidance, smollm2_info):
    vocab, token_bytes = smollm2_info.vocab_size, smollm2_info.token_bytes
    compiled = compile_grammar(ours(kind, name), smollm2_info, precompute=False)
    start = llguidance_matcher(smollm2_llguidance, source(kind, name), kind)
    special = sorted(smollm2_info.special_ids)
    rng = random.Random(name)
    steps = 0
    for walk in range(3):
        path = random_valid_path(GrammarMatcher(compiled), rng, max_tokens=40, end_bias=0.5)
        mine, theirs, text = GrammarMatcher(compiled), start.deep_copy(), b""
        for t in path + [None]:
            if t is None and mine.is_terminated():
                break
            a, b = mine.next_token_mask(), llguidance_mask(theirs, vocab)
            a[special] = b[special] = False
            skip = known_differences(text, token_bytes, kind)
            only_theirs = np.flatnonzero(b & ~a & ~skip)
            assert not only_theirs.size, (f"walk {walk} after {text!r}: llguidance allows "
                                          f"{[token_bytes[i] for i in only_theirs[:5]]}, ours does not")
            forced = theirs.compute_ff_bytes()
            only_ours = [i for i in np.flatnonzero(a & ~b & ~skip)
                         if not (forced.startswith(token_bytes[i]) and len(token_bytes[i]) < len(forced))]
            assert not only_ours, (f"walk {walk} after {text!r}: ours allows {[token_bytes[i] for i in only_ours[:5]]}"
                                   f", llguidance does not, and they are not part of the forced {forced!r}")
            steps += 1
            if t is None:
                break
            assert mine.accept_token(t) and theirs.consume_token(t), theirs.get_error()
            text += token_bytes[t]
        assert mine.is_terminated() == theirs.is_accepting(), text
    assert steps >= 10
