"""A compile's budget: hostile schemas are refused fast with the limit named, never with a
RecursionError; a deadline and cancel() stop a long compile; the default budget changes
nothing for ordinary schemas. The wall-clock bounds here are hang guards, not benchmarks."""
import json
import random
import threading
import time

import numpy as np
import pytest

from course.s08_structured.automaton import compile_automaton
from course.s08_structured.bench.testing import (EXAMPLE_EBNF, EXAMPLE_REGEXES, EXAMPLE_SCHEMAS, accepts, random_valid_path,
                                                 synthetic_vocab)
from course.s08_structured.budget import CompileBudget, CompileCancelled, CompileTimeout, LimitExceeded
from course.s08_structured.frontends.ebnf import parse_ebnf, to_ebnf
from course.s08_structured.frontends.regex_parser import parse_regex, regex_to_grammar
from course.s08_structured.grammar import Grammar, GrammarError, Seq, lit
from course.s08_structured.inlining import inline_rules
from course.s08_structured.json_schema import SchemaError, UnsupportedSchemaError, json_schema_to_grammar
from course.s08_structured.json_schema.document import document_shape
from course.s08_structured.matcher import GrammarMatcher, compile_grammar
from course.s08_structured.nfa import _NFA, nfa_states

VOCAB = synthetic_vocab(seed=0)
HANG_GUARD_S = 5.0  # "refused fast" means well under this, even on a slow shared machine


def nest(depth: int, leaf, wrap):
    for _ in range(depth):
        leaf = wrap(leaf)
    return leaf


def compile_schema(schema, budget=None, precompute=True):
    grammar = json_schema_to_grammar(schema, budget=budget)
    return compile_grammar(grammar, VOCAB, precompute=precompute, budget=budget)


def refused(schema, limit: str, budget=None):
    """Compile under the (default) budget: it must raise LimitExceeded naming `limit`, fast."""
    start = time.perf_counter()
    with pytest.raises(LimitExceeded) as info:
        compile_schema(schema, budget or CompileBudget())
    assert time.perf_counter() - start < HANG_GUARD_S
    assert info.value.limit == limit and f"{limit}={info.value.value}" in str(info.value)
    return str(info.value)


DEEP_ARRAYS = nest(400, {"type": "integer"}, lambda x: {"type": "array", "items": x})
DEEP_ENUM = {"enum": [nest(900, 1, lambda x: [x])]}
MANY_REQUIRED = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
                 "required": [f"p{i}" for i in range(3000)]}
HUGE_ENUM = {"enum": [f"value{i}" for i in range(15_000)]}
REF_CHAIN = {"$defs": {**{f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(3000)},
                       "a3000": {"type": "integer"}}, "$ref": "#/$defs/a0"}


# ---------------------------------------------------------------- the exceptions
def test_exception_classes_say_who_should_handle_them():
    assert issubclass(LimitExceeded, GrammarError) and issubclass(LimitExceeded, ValueError)
    assert issubclass(CompileTimeout, LimitExceeded)
    assert not issubclass(CompileCancelled, ValueError)
    err = LimitExceeded("max_depth", 64, "the schema nests 401 levels deep")
    assert str(err) == "the schema nests 401 levels deep; this server's limit is max_depth=64"
    assert "2 s" in str(CompileTimeout(2.0)) and "timeout_s" in str(CompileTimeout(2.0))


def test_document_shape_walks_without_recursion():
    assert document_shape({"a": [1, {"b": None}]}) == (4, 5, True)
    assert document_shape(nest(100_000, 1, lambda x: [x]))[:2] == (100_001, 100_001)
    _, nodes, complete = document_shape(list(range(50)), max_nodes=10)
    assert not complete and nodes > 10


# ---------------------------------------------------------------- hostile schemas: refused fast
def test_budget_refuses_deep_arrays_fast():
    message = refused(DEEP_ARRAYS, "max_depth")
    assert "402 levels deep" in message and "max_depth=64" in message


def test_budget_refuses_a_deeply_nested_enum_value_fast():
    refused(DEEP_ENUM, "max_depth")
    refused({"const": nest(900, {}, lambda x: {"a": x})}, "max_depth")


def test_budget_refuses_an_object_with_thousands_of_properties_fast():
    assert "3000 properties" in refused(MANY_REQUIRED, "max_properties")
    refused({"type": "array", "prefixItems": [{"type": "integer"}] * 3000}, "max_properties")


def test_budget_refuses_a_huge_enum_fast():
    assert "15000 values" in refused(HUGE_ENUM, "max_enum_values")
    assert "#/not" in refused({"type": "string", "not": HUGE_ENUM}, "max_enum_values")  # holes count too


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 1e20}, {"type": "string", "minLength": 1e9},
    {"type": "array", "maxItems": 10 ** 12}, {"type": "array", "items": {"type": "integer"}, "minItems": 10 ** 9},
    {"type": "string", "pattern": "^a{100000}$"},
    {"allOf": [{"type": "string"}, {"maxLength": 10 ** 15}]},
])
def test_budget_refuses_huge_counts_fast(schema):
    refused(schema, "max_repeat")


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^(a{1000}){1000}$"},           # each count is fine, the product is not
    {"type": "string", "pattern": "^((((a{50}){50}){50}){50})$"},
    {"type": "string", "pattern": "^.{0,9000}$"},                   # ~8 states per bounded character
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 100}] * 30},   # 30 different bounded strings
    {"enum": ["x" * 70_000]},                                       # one long literal
])
def test_budget_refuses_grammars_too_big_to_build_before_building_them(schema):
    assert "automaton states" in refused(schema, "max_build_states")


def test_a_length_bound_too_long_to_write_out_is_relaxed_by_name_or_refused_in_strict_mode():
    from course.s08_structured.json_schema import BEST_EFFORT, UnsupportedSchemaError
    from course.s08_structured.json_schema.build import MAX_UNROLLED_LENGTH

    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 4096}}, "required": ["note"]}
    with pytest.raises(UnsupportedSchemaError, match="maxLength") as e:
        json_schema_to_grammar(schema)
    assert e.value.pointer == "#/properties/note"
    grammar = json_schema_to_grammar(schema, mode=BEST_EFFORT)
    assert [(w.feature, w.pointer) for w in grammar.warnings] == [("maxLength", "#/properties/note")]
    long_note = '{"note": "' + "x" * (MAX_UNROLLED_LENGTH + 1) + '"}'
    assert accepts(grammar, long_note) and accepts(grammar, '{"note": ""}')   # larger, never smaller
    assert compile_automaton(grammar).num_positions < 200                     # written as a loop
    at_the_limit = {"type": "string", "minLength": 2, "maxLength": MAX_UNROLLED_LENGTH}
    exact = json_schema_to_grammar(at_the_limit)                              # still enforced exactly
    assert accepts(exact, '"' + "x" * MAX_UNROLLED_LENGTH + '"') and not accepts(exact, '"' + "x" * (MAX_UNROLLED_LENGTH + 1) + '"')
    assert not accepts(exact, '"x"')


def test_a_refusal_for_size_names_the_schemas_largest_part():
    schema = {"type": "object", "properties": {"id": {"enum": ["a", "b"]},
                                               "notes": {"type": "string", "pattern": "^.{0,9000}$"}}}
    assert "largest part: pattern at #/properties/notes" in refused(schema, "max_build_states")


def test_budget_refuses_an_automaton_that_blows_up_while_determinised():
    # A small NFA whose DFA needs 2^14 states: "an a 13 characters before the end".
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){13}$"}
    assert "determinised" in refused(schema, "max_build_states", CompileBudget(max_build_states=2000))


def test_budget_counts_positions_after_merging_equivalent_ones():
    # 30,000 built states (one long literal: nothing merges) are allowed to be built, then
    # refused for the masks they would need.
    assert "after merging" in refused({"enum": ["x" * 30_000]}, "max_states")


def test_budget_refuses_huge_integer_bounds_fast():
    refused({"type": "integer", "minimum": -10 ** 300, "maximum": 10 ** 300}, "max_integer_digits")
    refused({"type": "integer", "maximum": 1e308}, "max_integer_digits")


def test_budget_refuses_long_ref_chains_and_deep_regex_groups():
    assert "$defs/a" in refused(REF_CHAIN, "max_depth")
    refused({"type": "string", "pattern": "(" * 500 + "a" + ")" * 500}, "max_depth")
    # allOf around $ref next to other keywords: inlined targets count too
    chain = {"$defs": {**{f"a{i}": {"type": "integer", "$ref": f"#/$defs/a{i + 1}"} for i in range(500)},
                       "a500": {"type": "integer"}}, "$ref": "#/$defs/a0", "type": "integer"}
    refused(chain, "max_depth")


# ---------------------------------------------------------------- no RecursionError, budget or not
NO_RECURSION = {
    "deep arrays": DEEP_ARRAYS, "deep enum value": DEEP_ENUM, "ref chain": REF_CHAIN,
    "deep anyOf": nest(2000, {"type": "integer"}, lambda x: {"anyOf": [x]}),
    "deep regex groups": {"type": "string", "pattern": "(" * 3000 + "a" + ")" * 3000},
    "deep JSON text": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("name", NO_RECURSION)
def test_without_a_budget_deep_nesting_is_a_grammar_error_not_a_recursion_error(name):
    start = time.perf_counter()
    with pytest.raises(GrammarError, match="nests too deeply|Python's recursion limit"):
        compile_schema(NO_RECURSION[name])
    assert time.perf_counter() - start < HANG_GUARD_S


def test_long_chains_of_rules_compile_without_recursion():
    """Thousands of required properties are thousands of chained rules: inlining, the left
    recursion check and the clean-up walk them with loops, not recursion."""
    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1500)},
            "required": [f"p{i}" for i in range(1500)]}
    compiled = compile_schema(many, precompute=False)
    assert compiled.pda.can_end(compiled.pda.walk(compiled.pda.start_state(),
                                                  json.dumps({f"p{i}": i for i in range(1500)}).encode()))
    rules = "".join(f"r{i} ::= \"x\" r{i + 1}\n" for i in range(3000))
    compile_grammar(parse_ebnf(f"root ::= r0\n{rules}r3000 ::= \"y\"\n"), VOCAB, precompute=False)


def test_a_deep_expression_is_a_grammar_error_not_a_recursion_error():
    deep = nest(5000, lit("x"), lambda x: Seq((lit("a"), x, lit("b"))))
    with pytest.raises(GrammarError, match="nests too deeply"):
        compile_grammar(Grammar({"root": deep}), VOCAB)


@pytest.mark.parametrize("schema,error", [
    ('{"type": "integer", "maximum": 1' + "0" * 5000 + "}", SchemaError),   # json.loads' digit limit
    ({"type": "integer", "maximum": 10 ** 5000}, UnsupportedSchemaError),
    ({"type": "string", "pattern": "^a{99999999999}$"}, UnsupportedSchemaError),
])
def test_oversized_numbers_are_grammar_errors_without_a_budget(schema, error):
    with pytest.raises(error):
        json_schema_to_grammar(schema)


# ---------------------------------------------------------------- the deadline and cancel()
BIG = {"type": "string", "pattern": "^.{0,5000}$"}   # ~40,000 states: seconds of work, allowed by max_states=None


def test_a_compile_past_its_deadline_raises_compile_timeout_naming_what_it_was_building():
    start = time.perf_counter()
    with pytest.raises(CompileTimeout, match="timeout_s") as e:
        compile_schema(BIG, CompileBudget(timeout_s=0.3, max_states=None))
    assert time.perf_counter() - start < HANG_GUARD_S
    assert "rule" in e.value.working_on and e.value.working_on in str(e.value)   # the expensive part, by name


def test_the_deadline_counts_from_the_budgets_creation():
    budget = CompileBudget(timeout_s=0.05)
    time.sleep(0.1)  # waiting in a queue
    with pytest.raises(CompileTimeout):
        json_schema_to_grammar({"type": "integer"}, budget=budget)


def test_cancel_from_another_thread_stops_a_long_compile_promptly():
    budget = CompileBudget(timeout_s=None, max_states=None)
    outcome = {}

    def work():
        try:
            compile_schema(BIG, budget)
            outcome["result"] = "finished"
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome["result"] = e

    thread = threading.Thread(target=work)
    thread.start()
    time.sleep(0.3)
    cancelled_at = time.perf_counter()
    budget.cancel()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive() and time.perf_counter() - cancelled_at < HANG_GUARD_S
    assert isinstance(outcome["result"], CompileCancelled), outcome


def test_a_cancelled_budget_stops_both_entry_points():
    budget = CompileBudget()
    budget.cancel()
    with pytest.raises(CompileCancelled):
        json_schema_to_grammar({"type": "integer"}, budget=budget)
    with pytest.raises(CompileCancelled):
        compile_grammar(regex_to_grammar("[a-z]+"), VOCAB, budget=budget)


class Countdown(CompileBudget):
    """A budget that cancels itself at its n-th check: where a real cancel() could land."""

    def __init__(self, n: int):
        super().__init__(timeout_s=None)
        self.n, self.calls = n, 0

    def check(self):
        self.calls += 1
        if self.calls == self.n:
            self.cancel()
        super().check()


def test_every_phase_of_a_compile_can_be_cancelled_cleanly():
    """Cancel at the 1st, 2nd, 4th, ... check: grammar building, inlining, the automaton, the
    masks. Each stops with CompileCancelled and nothing else; the mask loop checks per position."""
    schema = EXAMPLE_SCHEMAS["order"]
    full = Countdown(0)
    compiled = compile_schema(schema, full)
    assert full.calls > compiled.automaton.num_positions
    n = 1
    while n < full.calls:
        with pytest.raises(CompileCancelled):
            compile_schema(schema, Countdown(n))
        n *= 2


# ---------------------------------------------------------------- the default budget changes nothing
def example_grammars(budget=None):
    for name, schema in EXAMPLE_SCHEMAS.items():
        yield f"schema-{name}", json_schema_to_grammar(schema, budget=budget)
    for name, pattern in EXAMPLE_REGEXES.items():
        yield f"regex-{name}", regex_to_grammar(pattern, budget=budget)
    for name, text in EXAMPLE_EBNF.items():
        yield f"ebnf-{name}", parse_ebnf(text)


def test_default_budget_builds_the_same_grammars():
    plain, budgeted = dict(example_grammars()), dict(example_grammars(CompileBudget()))
    assert {k: to_ebnf(g) for k, g in plain.items()} == {k: to_ebnf(g) for k, g in budgeted.items()}


@pytest.mark.parametrize("name", ["schema-person", "schema-order", "schema-tree", "schema-event",
                                  "regex-answer", "ebnf-sql_select"])
def test_default_budget_compiles_examples_to_the_same_masks(name):
    grammar = dict(example_grammars())[name]
    plain = compile_grammar(grammar, VOCAB)
    budgeted = compile_grammar(grammar, VOCAB, budget=CompileBudget())
    assert budgeted.automaton.num_positions == plain.automaton.num_positions
    rng = random.Random(name)
    for _ in range(2):
        a, b = GrammarMatcher(plain), GrammarMatcher(budgeted)
        for t in random_valid_path(GrammarMatcher(plain), rng, max_tokens=20):
            assert np.array_equal(a.next_token_mask(), b.next_token_mask())
            assert a.accept_token(t) and b.accept_token(t)


def test_default_budget_compiles_a_big_but_reasonable_enum():
    values = [f"item-{i:04d}" for i in range(2000)]
    start = time.perf_counter()
    compiled = compile_schema({"enum": values}, CompileBudget())
    assert time.perf_counter() - start < 30
    pda = compiled.pda
    assert all(pda.can_end(pda.walk(pda.start_state(), json.dumps(v).encode())) for v in values[::97])
    assert not pda.can_end(pda.walk(pda.start_state(), b'"item-2000"'))


# ---------------------------------------------------------------- the size estimate the budget trusts
@pytest.mark.parametrize("name", sorted(dict(example_grammars())))
def test_the_state_count_is_known_before_building(name):
    grammar = dict(example_grammars())[name]
    for g in (grammar, inline_rules(grammar)):
        for rule, body in g.rules.items():
            nfa = _NFA(rule, CompileBudget.unlimited())
            start, end = nfa.new(), nfa.new()
            nfa.build(body, start, end)
            assert 2 + nfa_states(body) == len(nfa.eps)
    assert compile_automaton(grammar, budget=CompileBudget()).num_positions > 0


def test_regex_limits_apply_to_plain_regexes_too():
    with pytest.raises(LimitExceeded, match="max_repeat"):
        parse_regex("a{20000}", CompileBudget())
    with pytest.raises(LimitExceeded, match="max_depth"):
        parse_regex("(" * 65 + "a" + ")" * 65, CompileBudget())
    assert parse_regex("(" * 64 + "a" + ")" * 64, CompileBudget()) == lit("a")
