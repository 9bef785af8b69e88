"""Grammar -> pushdown automaton tables: one small byte-level DFA per rule, plus calls.

Each rule body becomes a finite automaton over *bytes* whose edges are of two kinds:

    byte edge   (lo..hi) -> state     consume one byte in the range
    call edge   rule R   -> state     match all of rule R, then continue at `state`

Each rule body becomes a byte-level NFA first (nfa.py: UTF-8 expansion of character classes,
a Thompson construction that builds a shared sub-expression once per target). The NFA is then
made deterministic per rule (subset construction), so within one rule a byte never has two
targets; the only branching left is between consuming a byte and entering a call, and that is
the pushdown part (pda.py).

Every (rule, DFA state) pair gets one global integer: a *position*. The tables, indexed by
position, are all the run-time ever reads:

    trans[pos]   the 256 target positions, one per byte (-1 = no edge)
    calls[pos]   tuple of (callee's start position, return position)
    final[pos]   the rule may end here

The budget (budget.py) is charged as it goes: the grammar's size, known before anything is
built (nfa.py), and again as each rule is determinised, against `max_build_states`; what is left
once positions that behave the same are merged (minimize.py) against `max_states`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .budget import CompileBudget, LimitExceeded
from .grammar import Expr, Grammar, GrammarError
from .inlining import inline_rules, recursive_rules
from .minimize import minimize
from .nfa import MAX_NFA_STATES, _NFA, nfa_states

MAX_DFA_STATES = 100_000


@dataclass
class _RuleDFA:
    """A deterministic automaton for one rule: state 0 is the start."""
    edges: np.ndarray                              # byte edges (state, lo, hi, target): disjoint per state
    call_edges: list[list[tuple[str, int]]]        # per state: (rule, target), one target per rule
    final: list[bool]


def _determinize(nfa: _NFA, start: int, accept: int, room: int | None = None) -> _RuleDFA:
    """Subset construction. `room`: how many states the budget has left for this rule."""
    budget = nfa.budget
    # A subset is named by its states that do something (read a byte, call a rule, accept):
    # states with only epsilon edges change nothing about what follows, so `"` x* and
    # `"` x* after one more x are one DFA state, not two.
    acting = [bool(nfa.bytes[i] or nfa.calls[i]) or i == accept for i in range(len(nfa.eps))]
    closures: dict[tuple[int, ...], frozenset[int]] = {}   # the same target lists recur, piece after piece

    def closure(states) -> frozenset[int]:
        key = tuple(states)
        hit = closures.get(key)
        if hit is None:
            hit = closures[key] = frozenset(m for m in nfa.closure(states) if acting[m])
        return hit

    first = closure([start])
    ids = {first: 0}
    order = [first]
    byte_edges, call_edges, final = [], [], []     # (state, lo, hi, target); per state: (rule, target); bool
    for members in order:                          # `order` grows as new subsets appear
        if len(members) == 1 and len(nfa.bytes[m := next(iter(members))]) == 1 and not nfa.calls[m]:
            lo, hi, t = nfa.bytes[m][0]                # most states: one NFA state, one byte range
            byte_edges.append((len(final), lo, hi, _subset_id(closure((t,)), ids, order)))
            call_edges.append([])
        else:  # byte edges: each range's targets (overlapping ranges cut at every boundary first)
            edges = sorted(e for m in members for e in nfa.bytes[m])
            if all(x[1] < y[0] for x, y in zip(edges, edges[1:])):
                pieces = [(lo, hi, (t,)) for lo, hi, t in edges]
            else:
                cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
                pieces = [(a, b - 1, targets) for a, b in zip(cuts, cuts[1:])
                          if (targets := [t for lo, hi, t in edges if lo <= a and b - 1 <= hi])]
            out: list[tuple[int, int, int]] = []
            for lo, hi, targets in pieces:
                tid = _subset_id(closure(targets), ids, order)
                if out and out[-1][2] == tid and out[-1][1] == lo - 1:
                    out[-1] = (out[-1][0], hi, tid)   # merge neighbouring pieces with one target
                else:
                    out.append((lo, hi, tid))
            byte_edges += [(len(final), lo, hi, t) for lo, hi, t in out]
            calls: dict[str, list[int]] = {}
            for m in members:
                for rule, t in nfa.calls[m]:
                    calls.setdefault(rule, []).append(t)
            call_edges.append([(rule, _subset_id(closure(ts), ids, order)) for rule, ts in calls.items()])
        final.append(accept in members)
        if len(order) > MAX_DFA_STATES:
            raise GrammarError(f"rule {nfa.rule!r} needs over {MAX_DFA_STATES} automaton states; simplify it")
        if room is not None and len(order) > room:
            raise past_room(budget, nfa.rule)
        budget.check()
    return _RuleDFA(np.array(byte_edges, dtype=np.int64).reshape(-1, 4), call_edges, final)


def past_room(budget: CompileBudget, rule: str) -> LimitExceeded:
    """The refusal of a rule whose automaton outgrows the states the budget has left for it."""
    return LimitExceeded("max_build_states", budget.max_build_states, "the grammar's automaton grows "
                         f"past {budget.max_build_states} states while rule {rule!r} is determinised")


def build_rule(name: str, body: Expr, budget: CompileBudget, room: int | None = None) -> _RuleDFA:
    """One rule's automaton: its NFA, made deterministic (serving/rule_cache.py keeps small ones)."""
    nfa = _NFA(name, budget)
    start, accept = nfa.new(), nfa.new()
    nfa.build(body, start, accept)
    return _determinize(nfa, start, accept, room)


def _subset_id(subset: frozenset, ids: dict, order: list) -> int:
    if subset not in ids:
        ids[subset] = len(order)
        order.append(subset)
    return ids[subset]


# ---------------------------------------------------------------- the whole automaton
@dataclass
class Automaton:
    rule_names: list[str]
    rule_start: dict[str, int]          # rule -> its start position
    rule_of: list[str]                  # position -> rule (for messages and the notebook)
    trans: np.ndarray                   # int32 [positions, 256]: position -> each byte's target (-1 = none)
    calls: list[tuple[tuple[int, int], ...]]
    final: list[bool]
    scannable: list[bool]               # has at least one byte edge
    pure_end: list[bool]                # final, no edges: returning here = returning from the rule
    root_start: int
    edges: np.ndarray                   # trans, sparse: (position, lo, hi, target), a row per byte range

    @property
    def num_positions(self) -> int:
        return len(self.trans)


def compile_automaton(grammar: Grammar, inline: bool = True, budget: CompileBudget | None = None,
                      minimize_positions: bool = True, build: Callable = build_rule) -> Automaton:
    """The position tables of a grammar. With a budget: refused before anything is built if the
    grammar needs more than max_build_states states, refused after merging equivalent positions
    (minimize.py) if more than max_states are left (unmerged, max_build_states is the bound), and
    stopped at the deadline or on cancel().
    minimize_positions=False keeps every (rule, state) as its own position (to see what merging
    buys); `build` makes each rule's automaton (serving/rule_cache.py keeps small ones)."""
    budget = budget or CompileBudget.unlimited()
    try:
        return _compile_automaton(grammar, inline, budget, minimize_positions, build)
    except LimitExceeded as e:  # too big or too slow: name the schema's largest part too
        e.part = grammar.largest_part() if e.limit in ("max_build_states", "max_states", "timeout_s") else None
        raise


def _compile_automaton(grammar: Grammar, inline: bool, budget: CompileBudget,
                       minimize_positions: bool, build: Callable) -> Automaton:
    if inline:
        grammar = inline_rules(grammar, budget)
    _check_size(grammar, budget)
    dfas, base, total = {}, {}, 0                  # rule -> its automaton, its first position
    for name, body in grammar.rules.items():
        budget.working_on = f"building rule {name!r}"
        room = None if budget.max_build_states is None else budget.max_build_states - total
        dfas[name] = build(name, body, budget, room)
        base[name], total = total, total + len(dfas[name].final)
    # Every (rule, state) as a global position: byte edges as one array of (from, lo, hi, to).
    final, call_edges, rule_of = [], [], []
    for name, dfa in dfas.items():
        final += dfa.final
        rule_of += [name] * len(dfa.final)
        call_edges += [tuple((base[r], base[name] + t) for r, t in calls) for calls in dfa.call_edges]
    edges = np.concatenate([np.zeros((0, 4), dtype=np.int64)] +
                           [dfa.edges + [base[name], 0, 0, base[name]] for name, dfa in dfas.items()])
    merged, count = list(range(total)), total
    if minimize_positions:  # max_states bounds the merged positions (a mask each, if precomputed)
        budget.working_on = f"merging the {total} positions of {len(dfas)} rules"
        sparse = [[] for _ in range(total)]
        for src, lo, hi, t in edges.tolist():
            sparse[src].append((lo, hi, t))
        merged, count = minimize(final, sparse, call_edges, budget)
        budget.at_most("max_states", count, f"the grammar needs {count} automaton states after merging "
                       f"equivalent ones ({total} built)")
    first = np.unique(merged, return_index=True)[1].tolist()   # merged id -> the first position it stands for
    edges = edges[np.isin(edges[:, 0], first)]        # its edges stand for those of its equivalents
    edges[:, 0], edges[:, 3] = np.take(merged, edges[:, 0]), np.take(merged, edges[:, 3])
    src, lo, hi, dst = edges.T                        # the dense table: a range lo..hi is hi - lo + 1 cells
    cells = hi - lo + 1
    trans = np.full((count, 256), -1, dtype=np.int32)
    trans[np.repeat(src, cells), np.arange(int(cells.sum())) - np.repeat(np.cumsum(cells) - cells - lo, cells)] = \
        np.repeat(dst, cells)
    scannable = (np.bincount(src, minlength=count) > 0).tolist()
    calls = [tuple((merged[c], merged[r]) for c, r in call_edges[p]) for p in first]
    final, rule_of = [final[p] for p in first], [rule_of[p] for p in first]
    base = {name: merged[start] for name, start in base.items()}
    pure_end = [final[p] and not scannable[p] and not calls[p] for p in range(count)]
    auto = Automaton(list(dfas), base, rule_of, trans, calls, final, scannable, pure_end, base[grammar.root], edges)
    check_no_left_recursion(auto, budget)
    return auto


def _check_size(grammar: Grammar, budget: CompileBudget) -> None:
    """Refuse, before building anything, a rule over MAX_NFA_STATES states (always) or a grammar
    over the budget's max_build_states (its automaton has about as many states as its NFA)."""
    sizes = {name: 2 + nfa_states(body) for name, body in grammar.rules.items()}
    total = sum(sizes.values())
    biggest = max(sizes, key=sizes.get)
    budget.at_most("max_build_states", total, f"the grammar needs {total} automaton states (rule {biggest!r} "
                   f"alone {sizes[biggest]}: long literals and repetition counts multiply)")
    if sizes[biggest] > MAX_NFA_STATES:
        raise GrammarError(f"rule {biggest!r} is too large to compile ({sizes[biggest]} states, over "
                           f"{MAX_NFA_STATES}); lower its repetition counts")


def check_no_left_recursion(auto: Automaton, budget: CompileBudget | None = None) -> None:
    """A rule that can reach itself without consuming a byte (a ::= a "x" | ...) would make the
    pushdown automaton push forever. Find such cycles and name them."""
    budget = budget or CompileBudget.unlimited()
    start_to_rule = {p: r for r, p in auto.rule_start.items()}

    def reachable_without_bytes(rule: str, nullable: set[str]):
        seen, todo = {auto.rule_start[rule]}, [auto.rule_start[rule]]
        while todo:
            pos = todo.pop()
            yield pos
            for callee, ret in auto.calls[pos]:
                if start_to_rule[callee] in nullable and ret not in seen:
                    seen.add(ret)
                    todo.append(ret)

    nullable: set[str] = set()
    changed = True
    while changed:                                 # rules that can match the empty string
        changed = False
        for r in auto.rule_names:
            budget.check()
            if r not in nullable and any(auto.final[p] for p in reachable_without_bytes(r, nullable)):
                nullable.add(r)
                changed = True
    first_calls = {r: {start_to_rule[c] for p in reachable_without_bytes(r, nullable) for c, _ in auto.calls[p]}
                   for r in auto.rule_names}
    looping = recursive_rules(first_calls)         # rules on a cycle of calls made before any byte
    if looping:
        first = next(r for r in auto.rule_names if r in looping)
        came_from, todo = {}, [first]              # breadth-first from it, back to it
        while first not in came_from:
            r = todo.pop(0)
            for c in sorted(first_calls[r] - came_from.keys()):
                came_from[c] = r
                todo.append(c)
        cycle = [first]
        while len(cycle) == 1 or cycle[-1] != first:
            cycle.append(came_from[cycle[-1]])
        raise GrammarError("left recursion: " + " -> ".join(reversed(cycle)) +
                           " can repeat without consuming input; rewrite it with repetition "
                           "(a ::= a \"x\" | \"y\"  becomes  a ::= \"y\" \"x\"*)")
