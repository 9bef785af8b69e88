"""Objects with many optional properties and big shared pieces do not multiply automaton
states (nfa.py builds a shared sub-expression once per target;
automaton.inline_rules copies a rule only where that stays cheap; extra-key tries share their
way out). The language must not change: the same masks as the naive reference and xgrammar,
the exact state count the budget trusts, and outputs that validate."""
import json
import random

import jsonschema
import numpy as np
import pytest

from course.s08_structured.automaton import compile_automaton
from course.s08_structured.inlining import inline_rules
from course.s08_structured.nfa import _NFA
from course.s08_structured.budget import CompileBudget
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import GrammarMatcher, compile_grammar
from course.s08_structured.naive import naive_token_mask
from course.s08_structured.nfa import nfa_states
from course.s08_structured.bench.testing import (accepts, random_valid_path, sample_strings, synthetic_vocab,
                                                 xgrammar_compile, xgrammar_mask)

VOCAB = synthetic_vocab(seed=3, texts=("{}[]\":, -0123456789.ab_eé😀truefalsnul",
                                       '{"option_12": 3, "choices": [{"key": "label", "kind": "int", "optional": '
                                       'false}], "alpha": "alps", "beta": "betamax", "gamma": "delta", "été": 1}'))


def config_schema(options: int) -> dict:
    """The shape of changie's and cloudbuild's configs: many optional properties, and a list of
    objects with optional properties of their own."""
    kinds = ["string", "integer", "boolean"]
    props = {f"option_{i}": {"type": kinds[i % 3]} for i in range(options)}
    props["choices"] = {"type": "array", "items": {"type": "object", "properties": {
        "key": {"type": "string"}, "label": {"type": "string"}, "kind": {"enum": ["string", "int", "enum"]},
        "optional": {"type": "boolean"}}, "required": ["key"]}}
    return {"type": "object", "properties": props}


EXTRA_KEYS = {"type": "object", "properties": {name: {"type": "integer"} for name in
                                               ("alpha", "alps", "beta", "betamax", "gamma", "été", "delta")},
              "additionalProperties": {"type": "string"}}


def test_optional_properties_cost_states_linearly():
    # Before: each optional property's "rest of the members" rule was inlined two or three
    # times into the previous one (24 options: 10,028 positions, 40: 16,921, 60: over the
    # default budget's 20,000 states). Now the copies are one sub-automaton.
    sizes = {n: compile_automaton(json_schema_to_grammar(config_schema(n))).num_positions for n in (20, 40, 60)}
    assert sizes[60] < 4000, sizes
    assert sizes[60] - sizes[40] < 1.2 * (sizes[40] - sizes[20]), sizes   # linear, not doubling
    compile_automaton(json_schema_to_grammar(config_schema(60)), budget=CompileBudget())


def test_a_piece_used_in_many_places_stays_one_rule():
    # A 100-item list of bounded strings: pasting the string's ~1,200 states into each of the
    # 100 item slots would pass max_states; the item is one rule the slots call.
    schema = {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 100}
    auto = compile_automaton(json_schema_to_grammar(schema), budget=CompileBudget())
    assert auto.num_positions < 2500
    big_enum = {"enum": [f"zone/{i:03d}" for i in range(300)]}
    shared = {"type": "object", "properties": {f"tz{i}": big_enum for i in range(6)}}
    # (As built: merging equivalent positions would shrink the enum's trie to a few states.)
    once = compile_automaton(json_schema_to_grammar({"type": "object", "properties": {"tz0": big_enum}}),
                             minimize_positions=False)
    six = compile_automaton(json_schema_to_grammar(shared), minimize_positions=False)
    assert six.num_positions < 2 * once.num_positions


@pytest.mark.parametrize("schema", [config_schema(12), EXTRA_KEYS], ids=["config", "extra_keys"])
def test_the_state_count_with_sharing_is_exact(schema):
    grammar = inline_rules(json_schema_to_grammar(schema))
    for rule, body in grammar.rules.items():
        nfa = _NFA(rule, CompileBudget.unlimited())
        start, end = nfa.new(), nfa.new()
        nfa.build(body, start, end)
        assert 2 + nfa_states(body) == len(nfa.eps), rule


@pytest.mark.parametrize("schema", [config_schema(12), EXTRA_KEYS], ids=["config", "extra_keys"])
def test_shared_automata_masks_equal_the_naive_reference(schema):
    compiled = compile_grammar(json_schema_to_grammar(schema), VOCAB)
    rng = random.Random(json.dumps(schema))
    steps = 0
    for _ in range(4):
        matcher = GrammarMatcher(compiled)
        for t in random_valid_path(GrammarMatcher(compiled), rng, max_tokens=40, end_bias=0.0) + [None]:
            assert np.array_equal(matcher.next_token_mask(), naive_token_mask(matcher)), f"step {steps}"
            steps += 1
            if t is None:
                break
            assert matcher.accept_token(t)
    assert steps > 40


@pytest.mark.parametrize("schema", [config_schema(12), EXTRA_KEYS], ids=["config", "extra_keys"])
def test_drawn_outputs_validate(schema):
    grammar = json_schema_to_grammar(schema)
    for text in sample_strings(grammar, random.Random(0), 60):
        jsonschema.validate(json.loads(text), schema)


def test_extra_keys_still_avoid_the_declared_names():
    grammar = json_schema_to_grammar(EXTRA_KEYS)
    for name in ("alpha", "alps", "beta", "betamax", "gamma", "été", "delta"):
        assert not accepts(grammar, json.dumps({name: "x"}, ensure_ascii=False))
        assert accepts(grammar, json.dumps({name: 1}, ensure_ascii=False))
    for key in ("alph", "alphas", "alp", "bet", "betam", "été!", "ét", "é", "αλφα", "", "a\"b", "gamma\n",
                "Alpha"):
        assert accepts(grammar, json.dumps({key: "x"}, ensure_ascii=False)), key
    assert not accepts(grammar, '{"\\u0061lpha": "x"}')   # "alpha" in disguise


# The changie-like shape at 40 options (16,921 positions if every copy were built: over
# max_states), compiled under the default budget and compared with xgrammar on SmolLM2.
@pytest.mark.slow
def test_a_changie_shaped_schema_compiles_and_its_masks_equal_xgrammar(smollm2_xgrammar, smollm2_info):
    import xgrammar as xgr

    schema = config_schema(40)
    compiled = compile_grammar(json_schema_to_grammar(schema, mode="best-effort"), smollm2_info,
                               budget=CompileBudget())
    x_compiled = xgrammar_compile(smollm2_xgrammar, schema, "json_schema")
    special = sorted(smollm2_info.special_ids)
    rng = random.Random("config")
    steps = 0
    for _ in range(3):
        path = random_valid_path(GrammarMatcher(compiled), rng, max_tokens=40, end_bias=0.5)
        mine, theirs = GrammarMatcher(compiled), xgr.GrammarMatcher(x_compiled)
        for t in path:
            a, b = mine.next_token_mask(), xgrammar_mask(theirs, smollm2_info.vocab_size)
            a[special] = b[special] = False
            assert np.array_equal(a, b), f"step {steps}: {np.flatnonzero(a != b)[:5]}"
            steps += 1
            assert mine.accept_token(t) and theirs.accept_token(t)
    assert steps >= 30
