"""The cached masks equal the naive reference's at every step; the matcher API behaves."""
import random

import numpy as np
import pytest
import torch

from course.s08_structured.bench.testing import example_grammars, random_valid_path, synthetic_vocab
from course.s08_structured.frontends.ebnf import parse_ebnf
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.grammar import Grammar, GrammarError, chars, lit, seq, star
from course.s08_structured.mask_cache import store_verdicts
from course.s08_structured.matcher import (GrammarMatcher, allocate_token_bitmask, apply_token_bitmask,
                                           compile_grammar, pack_mask, unpack_bitmask)
from course.s08_structured.naive import naive_token_mask

VOCAB = synthetic_vocab(seed=0, texts=("{}[]\":, -0123456789.ab_eé😀truefalsnul", "SELECT * FROM WHERE AND ()+-*/",
                                       "yes no because @.com.org (555) 123-4567 ABC-019 2024-11-22"))


GRAMMARS = example_grammars()


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_masks_equal_the_naive_reference_at_every_step(name):
    compiled = compile_grammar(GRAMMARS[name](), VOCAB)
    rng = random.Random(name)
    steps = 0
    for _ in range(6):
        matcher = GrammarMatcher(compiled)
        for t in random_valid_path(GrammarMatcher(compiled), rng, max_tokens=40) + [None]:
            cached, naive = matcher.next_token_mask(), naive_token_mask(matcher)
            assert np.array_equal(cached, naive), f"step {steps}: differs at {np.flatnonzero(cached != naive)[:10]}"
            steps += 1
            if t is None:
                break
            assert matcher.accept_token(t)
    assert steps > 40


@pytest.mark.parametrize("name", ["schema-order", "regex-email", "ebnf-arithmetic"])
def test_rollback_restores_the_masks(name):
    compiled = compile_grammar(GRAMMARS[name](), VOCAB)
    matcher = GrammarMatcher(compiled)
    rng = random.Random(1)
    masks = []
    for t in random_valid_path(GrammarMatcher(compiled), rng, max_tokens=30, end_bias=0.0):
        masks.append(matcher.next_token_mask())
        assert matcher.accept_token(t)
    assert len(masks) > 9
    for k in (1, 3, 5):
        matcher.rollback(k)
        assert np.array_equal(matcher.next_token_mask(), masks[matcher.num_accepted])
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(matcher.num_accepted + 1)


def test_lazy_masks_equal_precomputed_ones():
    eager = compile_grammar(GRAMMARS["schema-person"](), VOCAB)
    lazy = compile_grammar(GRAMMARS["schema-person"](), VOCAB, precompute=False)
    assert not lazy.masks and eager.masks
    a, b = GrammarMatcher(eager), GrammarMatcher(lazy)
    for t in random_valid_path(GrammarMatcher(eager), random.Random(2), max_tokens=30):
        assert np.array_equal(a.next_token_mask(), b.next_token_mask())
        assert a.accept_token(t) and b.accept_token(t)


def test_stop_token_only_where_the_grammar_can_end_and_special_tokens_never():
    compiled = compile_grammar(Grammar({"root": seq(lit("ab"), star(lit("c")))}), VOCAB)
    stop, special = VOCAB.stop_ids[0], next(iter(VOCAB.special_ids))
    m = GrammarMatcher(compiled)
    assert not m.next_token_mask()[stop] and not m.accept_token(stop)
    assert m.accept_string("ab")
    mask = m.next_token_mask()
    assert mask[stop] and not mask[special] and m.can_terminate()
    assert not m.accept_token(special)
    assert m.accept_token(stop) and m.is_terminated()
    assert not m.next_token_mask().any() and not m.accept_token(VOCAB.token_bytes.index(b"c"))
    m.rollback(1)
    assert not m.is_terminated() and m.accept_token(VOCAB.token_bytes.index(b"c"))


def test_a_rejected_token_leaves_the_state_unchanged():
    m = GrammarMatcher(compile_grammar(regex_to_grammar("[0-9]+"), VOCAB))
    before = m.next_token_mask()
    assert not m.accept_token(VOCAB.token_bytes.index(b"a"))
    assert m.num_accepted == 0 and np.array_equal(m.next_token_mask(), before)


def test_tokens_that_split_a_utf8_character():
    # 'é' is two bytes, '😀' four: tokens holding part of one are allowed exactly where they fit.
    m = GrammarMatcher(compile_grammar(Grammar({"root": seq(lit('"'), star(chars('"', negated=True)), lit('"'))}),
                                       VOCAB))
    assert m.accept_string('"')
    assert m.accept_string("😀".encode()[:1]) and not m.accept_string(b'"')   # mid-character: no quote yet
    mask = m.next_token_mask()
    assert mask[VOCAB.token_bytes.index("😀".encode()[1:2])] and not mask[VOCAB.token_bytes.index(b"a")]


def test_every_storage_form_holds_the_same_set():
    compiled = compile_grammar(GRAMMARS["schema-order"](), VOCAB)
    rng = np.random.default_rng(0)
    verdict = rng.integers(0, 3, len(compiled.vocab)).astype(np.int8)
    stored = store_verdicts(compiled.vocab, verdict)
    expected = np.zeros(VOCAB.vocab_size, bool)
    expected[compiled.vocab.ids[verdict == 1]] = True
    for kind, data in (("accepted", np.flatnonzero(expected).astype(np.int32)),
                       ("bitset", np.packbits(expected, bitorder="little"))):
        entry = type(stored)(kind, data, stored.uncertain, 0, 0)
        mask = np.zeros(VOCAB.vocab_size, bool)
        entry.add_to(mask)
        assert np.array_equal(mask, expected), kind
    rest = expected.copy()
    rest[stored.uncertain] = True
    entry = type(stored)("rejected", np.flatnonzero(~rest).astype(np.int32), stored.uncertain, 0, 0)
    mask = np.zeros(VOCAB.vocab_size, bool)
    entry.add_to(mask)
    assert np.array_equal(mask, expected)


def test_the_cache_classifies_most_tokens_without_context():
    compiled = compile_grammar(GRAMMARS["schema-order"](), VOCAB)
    entries = list(compiled.masks.values())
    uncertain = sum(e.uncertain.size for e in entries)
    assert uncertain < 0.1 * len(entries) * len(compiled.vocab)
    assert any(e.uncertain.size for e in entries)   # some tokens do need the stack (e.g. '"}')
    assert {e.kind for e in entries} >= {"accepted"}


def test_bitmask_layout_and_apply():
    rng = np.random.default_rng(0)
    mask = rng.random(70) < 0.3
    words = torch.from_numpy(pack_mask(mask))
    assert words.dtype == torch.int32 and words.shape == (3,)
    assert torch.equal(unpack_bitmask(words, 70), torch.from_numpy(mask))
    assert bool(words[0] & 1) == mask[0] and bool((words[1] >> 5) & 1) == mask[37]
    logits = torch.randn(2, 80)                        # an lm_head padded past the vocabulary
    bitmask = allocate_token_bitmask(2, 70)
    bitmask[0] = words
    bitmask[1] = torch.from_numpy(pack_mask(np.ones(70, bool)))
    apply_token_bitmask(logits, bitmask)
    assert torch.equal(torch.isfinite(logits[0, :70]), torch.from_numpy(mask))
    assert torch.isinf(logits[:, 70:]).all() and torch.isfinite(logits[1, :70]).all()


def test_fill_bitmask_agrees_with_the_bool_mask():
    m = GrammarMatcher(compile_grammar(GRAMMARS["ebnf-sql_select"](), VOCAB))
    m.accept_string("SELECT a")
    bitmask = allocate_token_bitmask(1, VOCAB.vocab_size)
    m.fill_next_token_bitmask(bitmask)
    assert torch.equal(unpack_bitmask(bitmask[0], VOCAB.vocab_size), torch.from_numpy(m.next_token_mask()))


def test_left_recursion_is_refused_with_the_cycle_named():
    with pytest.raises(GrammarError, match="left recursion: root -> expr -> root"):
        compile_grammar(parse_ebnf('root ::= expr "+" "1" | "1"\nexpr ::= root'), VOCAB)
