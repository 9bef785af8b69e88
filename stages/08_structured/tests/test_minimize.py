"""Equivalent positions merged across the whole grammar (minimize.py).

Merging must never change the language or a mask (every merged pair behaves the same: checked
as a stable partition, and masks compared with the automaton as built), and must find every
merge there is (the same number of blocks as Moore's textbook refinement)."""
import json
import random

import numpy as np
import pytest

from course.s08_structured.automaton import compile_automaton
from course.s08_structured.budget import CompileBudget, LimitExceeded
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import GrammarMatcher, compile_grammar
from course.s08_structured.minimize import _joined, minimize
from course.s08_structured.bench.testing import accepts, random_valid_path, synthetic_vocab

from .test_shared_automata import EXTRA_KEYS, config_schema


def row(p, final, edges, calls, block):
    return (final[p], _joined(tuple((lo, hi, block[t]) for lo, hi, t in edges[p])),
            frozenset((block[c], block[r]) for c, r in calls[p]))


def moore(final, edges, calls) -> int:
    """The textbook: refine every position every round until no block splits."""
    block = [int(f) for f in final]
    while True:
        ids: dict = {}
        new = [ids.setdefault((block[p],) + row(p, final, edges, calls, block), len(ids)) for p in range(len(final))]
        if len(ids) == len(set(block)):
            return len(ids)
        block = new


def random_automaton(rng, n):
    final = [rng.random() < 0.3 for _ in range(n)]
    edges = [tuple((b, b, rng.randrange(n)) for b in sorted(rng.sample(range(4), rng.randint(0, 3))))
             for _ in range(n)]
    calls = [tuple((rng.randrange(n), rng.randrange(n)) for _ in range(rng.random() < 0.2)) for _ in range(n)]
    return final, edges, calls


def test_merges_only_equivalent_positions_and_all_of_them():
    rng = random.Random(0)
    for _ in range(3000):
        final, edges, calls = random_automaton(rng, rng.randint(2, 12))
        merged, count = minimize(final, edges, calls)
        assert sorted(set(merged)) == list(range(count))
        rows = {}
        for p in range(len(final)):   # stable: every member of a block has the block's row
            assert rows.setdefault(merged[p], row(p, final, edges, calls, merged)) == \
                row(p, final, edges, calls, merged)
        assert count == moore(final, edges, calls)


def test_ranges_into_merged_targets_are_joined():
    # p reads a, b into two positions that turn out equivalent: p equals q, which reads a..b into one.
    final = [False, False, True, True, True]
    edges = [((97, 97, 2), (98, 98, 3)), ((97, 98, 4),), (), (), ()]
    merged, count = minimize(final, edges, [()] * 5)
    assert merged[0] == merged[1] and count == 2


SCHEMAS = [config_schema(12), EXTRA_KEYS,
           {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {
               "type": "object", "properties": {"a": {"type": "string"}, "c": {"enum": ["x", "yz"]}}}}}}]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["config", "extra_keys", "nested"])
def test_masks_equal_the_automaton_as_built(schema):
    grammar = json_schema_to_grammar(schema)
    vocab = synthetic_vocab(seed=5, texts=(json.dumps({"a": "x", "b": [{"a": "yz", "c": "x"}], "option_1": 3}),))
    merged = compile_grammar(grammar, vocab)
    built = compile_grammar(grammar, vocab, minimize=False)
    assert merged.automaton.num_positions < built.automaton.num_positions
    rng = random.Random(1)
    steps = 0
    for _ in range(4):
        path = random_valid_path(GrammarMatcher(merged), rng, max_tokens=40, end_bias=0.0)
        a, b = GrammarMatcher(merged), GrammarMatcher(built)
        for t in path + [None]:
            assert np.array_equal(a.next_token_mask(), b.next_token_mask()), f"step {steps}"
            steps += 1
            if t is not None:
                assert a.accept_token(t) and b.accept_token(t)
    assert steps > 20


def test_a_lists_first_item_shares_the_states_of_the_items_after_it():
    # [item, item, ...]: `"[" item (", " item)*` builds the item twice, once before the loop and
    # once inside it; both copies read alike, and so do the string loops inside them.
    schema = {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"},
                                                                           "b": {"type": "integer"}},
                                         "required": ["a", "b"]}}
    grammar = json_schema_to_grammar(schema)
    merged = compile_automaton(grammar)
    built = compile_automaton(grammar, minimize_positions=False)
    assert merged.num_positions < 0.6 * built.num_positions
    for text in ['[]', '[{"a": "x", "b": 1}]', '[{"a": "", "b": -2}, {"a": "é\\n", "b": 30}]']:
        assert accepts(grammar, text), text
    for text in ['[{"a": "x"}]', '[{"a": "x", "b": 1},]', '[{"b": 1, "a": "x"}]']:
        assert not accepts(grammar, text), text


def test_max_states_counts_the_merged_positions_and_max_build_states_the_built_ones():
    grammar = json_schema_to_grammar({"type": "object", "properties": {f"k{i}": {"type": "string"}
                                                                       for i in range(6)}})
    merged = compile_automaton(grammar).num_positions
    built = compile_automaton(grammar, minimize_positions=False).num_positions
    compile_automaton(grammar, budget=CompileBudget(max_states=merged))
    with pytest.raises(LimitExceeded) as info:
        compile_automaton(grammar, budget=CompileBudget(max_states=merged - 1))
    assert info.value.limit == "max_states" and "after merging" in str(info.value)
    with pytest.raises(LimitExceeded) as info:
        compile_automaton(grammar, budget=CompileBudget(max_build_states=built // 2))
    assert info.value.limit == "max_build_states"
