"""Rule automata kept across schemas (serving/rule_cache.py): the same automata as building every
rule anew, a shared rule built once per process, and the budget's limits still hold for a kept rule."""
import numpy as np
import pytest

from course.s08_structured import automaton
from course.s08_structured.automaton import compile_automaton
from course.s08_structured.budget import CompileBudget, LimitExceeded
from course.s08_structured.grammar import Grammar, Repeat, alt, lit, seq, star
from course.s08_structured.json_schema import SERVING_BOUNDS, json_schema_to_grammar
from course.s08_structured.realworld.bench_finish import example_and_realworld_schemas
from course.s08_structured.serving import rule_cache
from course.s08_structured.serving.rule_cache import cached_build_rule


@pytest.fixture(autouse=True)
def fresh_cache():
    rule_cache.forget()
    yield
    rule_cache.forget()


def same_automaton(a, b) -> bool:
    return (np.array_equal(a.trans, b.trans) and np.array_equal(a.edges, b.edges) and a.calls == b.calls
            and a.final == b.final and a.rule_of == b.rule_of and a.rule_start == b.rule_start
            and a.pure_end == b.pure_end and a.scannable == b.scannable)


@pytest.mark.parametrize("minimize", [False, True])
def test_kept_rules_give_the_automata_built_anew(minimize):
    for name, schema in example_and_realworld_schemas().items():   # the second one on reuses kept rules
        grammar = json_schema_to_grammar(schema, mode="best-effort", default_bounds=SERVING_BOUNDS)
        kept = compile_automaton(grammar, minimize_positions=minimize, build=cached_build_rule)
        assert same_automaton(kept, compile_automaton(grammar, minimize_positions=minimize)), name
    assert ("string_max64",) in {key[:1] for key in rule_cache._kept}


def test_a_shared_rule_is_built_once_per_process(monkeypatch):
    built = []
    real = rule_cache.build_rule
    monkeypatch.setattr(rule_cache, "build_rule", lambda name, *a: built.append(name) or real(name, *a))
    using = 0
    for schema in example_and_realworld_schemas().values():
        auto = compile_automaton(json_schema_to_grammar(schema, mode="best-effort", default_bounds=SERVING_BOUNDS),
                                 minimize_positions=False, build=cached_build_rule)
        using += "string_max64" in auto.rule_names
    assert using > 5 and built.count("string_max64") == 1 and built.count("root") == len(example_and_realworld_schemas())


def test_a_kept_rule_still_counts_against_the_build_limit():
    # (a|b)* a (a|b){6}: a small body whose automaton has 2^7 states, more than its NFA
    body = seq(star(alt(lit("a"), lit("b"))), lit("a"), Repeat(alt(lit("a"), lit("b")), 6, 6))
    grammar = Grammar({"root": seq(lit("<"), body, lit(">"))}, "root")
    built = compile_automaton(grammar, build=cached_build_rule, minimize_positions=False)
    states = built.num_positions
    assert states > 100 and rule_cache._kept
    for build in (automaton.build_rule, cached_build_rule):   # built anew, or kept: the same refusal
        with pytest.raises(LimitExceeded, match="max_build_states"):
            compile_automaton(grammar, budget=CompileBudget(max_build_states=states - 10), build=build,
                              minimize_positions=False)


def test_big_bodies_and_big_automata_are_not_kept():
    big_body = alt(*(lit(f"word{i}") for i in range(100)))          # over 64 nodes
    big_automaton = seq(lit('"'), Repeat(alt(lit("x"), lit("yy")), 0, 3000), lit('"'))   # over 2,048 states
    for body in (big_body, big_automaton):
        compile_automaton(Grammar({"root": body}, "root"), build=cached_build_rule, minimize_positions=False)
    assert not rule_cache._kept
