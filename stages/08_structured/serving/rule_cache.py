"""Rule automata built once per process: what the schemas a server compiles have in common.

A rule's automaton depends on its name and body alone, and a server's schemas share many bodies:
the JSON front end's `string`, `number`, `value`, and above all the default-bounded string of
json_schema/defaults.py, `string_max64`: a body of a dozen nodes whose automaton is 64 copies of a
JSON string character's states (about 840 positions: most of a typical served schema's automaton,
and two thirds of its compile). `cached_build_rule` is automaton.py's `build_rule` with a memory
for small bodies, so a new schema builds only the rules that are its own:

    compile_grammar(grammar, info, build_rule=cached_build_rule)     # final/'s grammar cache

Only bodies of at most 64 nodes are kept (a key is hashed and compared in full), and only
automata of at most 2,048 states, 128 of them at most (past that the cache starts afresh): a few
MB. A kept automaton is read, never changed, so requests on any thread share it.
"""
from __future__ import annotations

from ..automaton import _RuleDFA, build_rule, past_room
from ..budget import CompileBudget
from ..grammar import Expr
from ..inlining import _size_at_most

MAX_BODY_NODES = 64
MAX_STATES = 2048
MAX_RULES = 128

_kept: dict[tuple[str, Expr], _RuleDFA] = {}


def cached_build_rule(name: str, body: Expr, budget: CompileBudget, room: int | None = None) -> _RuleDFA:
    key = (name, body) if _size_at_most(body, MAX_BODY_NODES) else None
    dfa = _kept.get(key)
    if dfa is None:
        dfa = build_rule(name, body, budget, room)
        if key is not None and len(dfa.final) <= MAX_STATES:
            if len(_kept) >= MAX_RULES:
                _kept.clear()
            _kept[key] = dfa
    elif room is not None and len(dfa.final) > room:   # the budget's limit holds for a kept rule too
        raise past_room(budget, name)
    return dfa


def forget() -> None:
    """Drop every kept automaton (tests start from nothing)."""
    _kept.clear()
