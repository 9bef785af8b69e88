"""Which rules become part of their callers (inlining), and which identical rules become one.

Why inline at all: a token can only be settled at compile time while it stays inside one rule
(mask_cache.py). If a JSON string's characters are a rule of their own, every token of two or
more characters has to leave that rule and come back, so nearly the whole vocabulary would be
"uncertain" inside strings. Inlined, the string is one automaton and those tokens are accepted
or rejected ahead of time. XGrammar inlines rules too.

Why not inline everything small: each copy is more automaton states, each with a precomputed
mask. Real schemas use the same piece in many places (a time-zone enum of 600 names in six
properties, an object inside a list of up to 500 items), and SchemaStore's schemas repeat whole
definitions under different names. So, before inlining, rules with identical bodies become one
rule, and a rule is copied only where it is used once, is small, or its copies stay few.
"""
from __future__ import annotations

from .budget import CompileBudget
from .grammar import Alt, Expr, Grammar, Ref, Repeat, Seq, refs_in
from .nfa import nfa_states

INLINE_MAX_NODES = 400   # a rule whose (inlined) body is at most this big is copied into its callers
INLINE_SMALL_STATES = 64  # ... if it is this small (a string, a number), wherever it is used
INLINE_GROWTH = 2048      # ... or if all its copies together add at most this many states


def _size_at_most(e: Expr, limit: int) -> bool:
    """Does the expression tree have at most `limit` nodes? (Counting stops past the limit.)"""
    count, todo = 0, [e]
    while todo:
        x = todo.pop()
        count += 1
        if count > limit:
            return False
        if isinstance(x, (Seq, Alt)):
            todo.extend(x.items)
        elif isinstance(x, Repeat):
            todo.append(x.item)
    return True


def _substitute(e: Expr, bodies: dict[str, Expr], memo: dict[int, tuple[Expr, Expr]]) -> Expr:
    """e with each Ref to a rule in `bodies` replaced by that body. One input object gives one
    output object (memo, by id), and a part with nothing to replace is returned as it is: so
    the uses of an inlined rule stay one object, which the NFA builds once per target (nfa.py)."""
    hit = memo.get(id(e))
    if hit is not None:
        return hit[0]
    if isinstance(e, Ref):
        out = bodies.get(e.name, e)
    elif isinstance(e, (Seq, Alt)):
        items = tuple(_substitute(i, bodies, memo) for i in e.items)
        out = e if all(a is b for a, b in zip(items, e.items)) else type(e)(items)
    elif isinstance(e, Repeat):
        item = _substitute(e.item, bodies, memo)
        out = e if item is e.item else Repeat(item, e.min, e.max)
    else:
        out = e
    memo[id(e)] = (out, e)                         # keep e alive: its id stays unique
    return out


def inline_rules(grammar: Grammar, budget: CompileBudget | None = None) -> Grammar:
    """Merge identical rules, then copy non-recursive rules into their callers where that is
    cheap (_cheap_to_copy). The result is for the automaton: same language, fewer rules."""
    budget = budget or CompileBudget.unlimited()
    grammar = merge_twin_rules(grammar, budget)
    calls = {name: {r.name for r in refs_in(body)} for name, body in grammar.rules.items()}
    recursive = recursive_rules(calls)
    copies = _copies(grammar)
    bodies: dict[str, Expr] = {}     # rules already inlined, by name
    done: dict[str, Expr] = {}
    memo: dict = {}                  # valid throughout: a rule's callees are decided before it
    for name in _callees_first(calls, list(grammar.rules)):
        budget.check()
        body = done[name] = _substitute(grammar.rules[name], bodies, memo)
        if name not in recursive and name != grammar.root and name not in grammar.keep \
                and _size_at_most(body, INLINE_MAX_NODES) and _cheap_to_copy(body, copies[name]):
            bodies[name] = body
    # A rule inlined everywhere it was used is no longer needed.
    rules = {n: _substitute(done[n], bodies, memo) for n in grammar.rules if n not in bodies}
    return Grammar(rules, grammar.root)


def merge_twin_rules(grammar: Grammar, budget: CompileBudget | None = None) -> Grammar:
    """Rules whose bodies are equal once their callees' twins are merged become one rule (the
    first of them): the JSON Schema front end (json_schema/) gives every use of a definition, every property, its own
    rule, and many are spelled alike. Callees first, so twins of twins are found in one pass."""
    budget = budget or CompileBudget.unlimited()
    calls = {name: {r.name for r in refs_in(body)} for name, body in grammar.rules.items()}
    renamed: dict[str, Expr] = {}    # a twin -> a reference to the rule kept for it
    first_with: dict[tuple, str] = {}
    rules: dict[str, Expr] = {}
    memo: dict = {}
    for name in _callees_first(calls, list(grammar.rules)):
        budget.check()
        body = _substitute(grammar.rules[name], renamed, memo)
        key = (body, name in grammar.keep)
        twin = first_with.get(key)
        if twin is not None and name != grammar.root:
            renamed[name] = Ref(twin)
        else:
            first_with.setdefault(key, name)
            rules[name] = body
    if not renamed:
        return grammar
    # (a rule in a recursive cycle may still name a twin: its callee came later)
    rules = {n: _substitute(rules[n], renamed, memo) for n in grammar.rules if n in rules}
    return Grammar(rules, grammar.root, keep=frozenset(n for n in grammar.keep if n in rules))


def _cheap_to_copy(body: Expr, copies: int) -> bool:
    """Inlining pastes `copies` copies of the body where there were calls: fine if it is used
    once, or small, or its copies stay few. Otherwise it stays a rule that every caller shares:
    an enum of 600 time zones used in six places, an object inside a list of up to 500 items."""
    if copies <= 1:
        return True
    states = nfa_states(body)
    return states <= INLINE_SMALL_STATES or states * copies <= INLINE_GROWTH


def _copies(grammar: Grammar) -> dict[str, int]:
    """How many times the automaton would build each rule's references, over all rule bodies:
    a reference inside a repetition {m,n} is built n times (an upper bound: nfa.py builds a
    part used twice towards one target once)."""
    out = {name: 0 for name in grammar.rules}
    for body in grammar.rules.values():
        todo = [(body, 1)]
        while todo:
            e, times = todo.pop()
            if isinstance(e, Ref):
                out[e.name] += times
            elif isinstance(e, (Seq, Alt)):
                todo.extend((it, times) for it in e.items)
            elif isinstance(e, Repeat):
                todo.append((e.item, times * max(e.min + (1 if e.max is None else e.max - e.min), 1)))
    return out


def _callees_first(calls: dict[str, set[str]], roots: list[str]) -> list[str]:
    """Every rule reachable from `roots`, each after the rules it calls (depth-first post-order;
    a call back into a rule still being visited is a cycle and is skipped). A loop with its
    own stack, so a chain of thousands of rules is fine."""
    order: list[str] = []
    visited: set[str] = set()
    for root in roots:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(sorted(calls[root])))]
        while stack:
            name, callees = stack[-1]
            callee = next((c for c in callees if c not in visited), None)
            if callee is None:
                stack.pop()
                order.append(name)
            else:
                visited.add(callee)
                stack.append((callee, iter(sorted(calls[callee]))))
    return order


def recursive_rules(calls: dict[str, set[str]]) -> set[str]:
    """Rules that can reach themselves. Kosaraju's method: in the post-order above, the last rule
    finished starts a strongly connected component; walking the *reversed* call graph from it
    finds exactly its component. A rule is recursive if its component has more than one rule,
    or it calls itself. Linear in the size of the call graph."""
    callers: dict[str, set[str]] = {name: set() for name in calls}
    for name, callees in calls.items():
        for c in callees:
            callers[c].add(name)
    component: dict[str, int] = {}
    for start in reversed(_callees_first(calls, list(calls))):
        if start in component:
            continue
        component[start], todo = start, [start]
        while todo:
            for c in callers[todo.pop()]:
                if c not in component:
                    component[c] = start
                    todo.append(c)
    size: dict[str, int] = {}
    for leader in component.values():
        size[leader] = size.get(leader, 0) + 1
    return {name for name in calls if size[component[name]] > 1 or name in calls[name]}


