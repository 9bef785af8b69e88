"""Grammar -> pushdown automaton tables: one small byte-level DFA per rule, plus calls.

Each rule body becomes a finite automaton over *bytes* whose edges are of two kinds:

    byte edge   (lo..hi) -> state     consume one byte in the range
    call edge   rule R   -> state     match all of rule R, then continue at `state`

Character classes are expanded into UTF-8 byte sequences first (U+0080..U+07FF is two bytes,
[C2-DF][80-BF], and so on), so a token that ends inside a multi-byte character is no problem:
the automaton simply stops between two bytes of it. The NFA (Thompson construction) is then
made deterministic per rule (subset construction), so within one rule a byte never has two
targets; the only branching left is between consuming a byte and entering a call, and that is
the pushdown part (pda.py).

Every (rule, DFA state) pair gets one global integer: a *position*. The tables, indexed by
position, are all the run-time ever reads:

    trans[pos]   list of 256 target positions (-1 = no edge)
    calls[pos]   tuple of (callee's start position, return position)
    final[pos]   the rule may end here

Sizes are known before anything is built: `nfa_states(expr)` counts the states the Thompson
construction will create (a repetition {m,n} costs n copies of its item), so a runaway count
is refused in microseconds instead of after building half a million states. With a
CompileBudget, the whole grammar must fit in `max_states` states, the automaton is checked
again as it is determinised, and the budget's deadline is checked per state.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .budget import CompileBudget, LimitExceeded
from .grammar import Alt, Bytes, CharClass, Expr, Grammar, GrammarError, Ref, Repeat, Seq, refs_in

MAX_NFA_STATES = 500_000   # beyond this a rule is almost surely a runaway repetition count
MAX_DFA_STATES = 100_000


# ---------------------------------------------------------------- UTF-8
_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF, 0x10FFFF)


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose union is exactly the UTF-8 encodings of code points lo..hi.
    E.g. U+0080..U+07FF -> [[(0xC2, 0xDF), (0x80, 0xBF)]]."""
    out: list[list[tuple[int, int]]] = []

    def split(lo: int, hi: int) -> None:
        for limit in _LENGTH_LIMITS[:-1]:          # never mix encodings of different lengths
            if lo <= limit < hi:
                split(lo, limit)
                split(limit + 1, hi)
                return
        if hi <= 0x7F:
            out.append([(lo, hi)])
            return
        n = 2 if hi <= 0x7FF else 3 if hi <= 0xFFFF else 4
        for i in range(1, n):                      # align so each byte position is a full range
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    split(lo, lo | m)
                    split((lo | m) + 1, hi)
                    return
                if hi & m != m:
                    split(lo, (hi & ~m) - 1)
                    split(hi & ~m, hi)
                    return
        a, b = chr(lo).encode(), chr(hi).encode()
        out.append(list(zip(a, b)))

    split(lo, hi)
    return out


@lru_cache(maxsize=4096)
def class_sequences(cls: CharClass) -> tuple[tuple[tuple[int, int], ...], ...]:
    """All byte-range sequences of a character class (cached: the same classes recur)."""
    return tuple(tuple(seq) for lo, hi in cls.ranges for seq in utf8_sequences(lo, hi))


# ---------------------------------------------------------------- NFA (Thompson)
class _NFA:
    def __init__(self, rule: str, budget: CompileBudget):
        self.rule, self.budget = rule, budget
        self.eps: list[list[int]] = []
        self.bytes: list[list[tuple[int, int, int]]] = []
        self.calls: list[list[tuple[str, int]]] = []

    def new(self) -> int:
        if len(self.eps) & 1023 == 0:              # now and then: is the deadline past?
            self.budget.check()
        self.eps.append([])
        self.bytes.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def build(self, e: Expr, s: int, t: int) -> None:
        """Add edges so that the paths from s to t spell exactly the strings of e."""
        if isinstance(e, Bytes):
            cur = s
            for i, b in enumerate(e.value):
                nxt = t if i == len(e.value) - 1 else self.new()
                self.bytes[cur].append((b, b, nxt))
                cur = nxt
            if not e.value:
                self.eps[s].append(t)
        elif isinstance(e, CharClass):
            for ranges in class_sequences(e):
                cur = s
                for i, (a, b) in enumerate(ranges):
                    nxt = t if i == len(ranges) - 1 else self.new()
                    self.bytes[cur].append((a, b, nxt))
                    cur = nxt
        elif isinstance(e, Ref):
            self.calls[s].append((e.name, t))
        elif isinstance(e, Seq):
            cur = s
            for i, item in enumerate(e.items):
                nxt = t if i == len(e.items) - 1 else self.new()
                self.build(item, cur, nxt)
                cur = nxt
        elif isinstance(e, Alt):
            words, others = _literals_apart(e)
            inner, edges = literal_trie(words)
            ids = [s] + [self.new() for _ in range(inner)]
            for a, b, c in edges:
                self.bytes[ids[a]].append((b, b, t if c < 0 else ids[c]))
            for item in others:
                self.build(item, s, t)
        elif isinstance(e, Repeat):
            cur = s
            for _ in range(e.min):
                nxt = self.new()
                self.build(e.item, cur, nxt)
                cur = nxt
            if e.max is None:                      # a loop state: any number of further copies
                loop = self.new()
                self.eps[cur].append(loop)
                self.build(e.item, loop, loop)
                self.eps[loop].append(t)
            else:                                  # up to max-min optional copies
                for _ in range(e.max - e.min):
                    self.eps[cur].append(t)
                    nxt = self.new()
                    self.build(e.item, cur, nxt)
                    cur = nxt
                self.eps[cur].append(t)
        else:
            raise TypeError(f"not a grammar expression: {e!r}")

    def closure(self, states) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def _literals_apart(e: Alt) -> tuple[list[bytes], list]:
    """An alternation's non-empty literals, and its other alternatives."""
    words = [it.value for it in e.items if isinstance(it, Bytes) and it.value]
    return words, [it for it in e.items if not (isinstance(it, Bytes) and it.value)]


def literal_trie(words: list[bytes]) -> tuple[int, list[tuple[int, int, int]]]:
    """Literal alternatives as a trie, so that alternatives sharing a prefix share its states: an
    enum of 4,000 strings needs about as many states as it has distinct prefixes, not as its
    total length. Returns (number of inner nodes, edges (from, byte, to)); node 0 is the start,
    -1 the end, 1.. the inner nodes."""
    children: dict[tuple[int, int], int] = {}
    edges = []
    for w in words:
        cur = 0
        for b in w[:-1]:
            nxt = children.get((cur, b))
            if nxt is None:
                nxt = children[(cur, b)] = len(children) + 1
                edges.append((cur, b, nxt))
            cur = nxt
        edges.append((cur, w[-1], -1))
    return len(children), edges


def nfa_states(e: Expr, memo: dict | None = None) -> int:
    """The number of states _NFA.build(e, s, t) creates (s and t not counted), computed from
    the expression alone; shared sub-expressions are counted once per use, as build does."""
    memo = {} if memo is None else memo
    key = id(e)
    if key not in memo:
        if isinstance(e, Bytes):
            n = max(len(e.value) - 1, 0)
        elif isinstance(e, CharClass):
            n = sum(len(seq) - 1 for seq in class_sequences(e))
        elif isinstance(e, Ref):
            n = 0
        elif isinstance(e, Seq):
            n = max(len(e.items) - 1, 0) + sum(nfa_states(it, memo) for it in e.items)
        elif isinstance(e, Alt):
            words, others = _literals_apart(e)
            n = literal_trie(words)[0] + sum(nfa_states(it, memo) for it in others)
        elif isinstance(e, Repeat):
            copy = 1 + nfa_states(e.item, memo)    # one copy of the item and the state after it
            n = e.min * copy + (copy if e.max is None else (e.max - e.min) * copy)
        else:
            raise TypeError(f"not a grammar expression: {e!r}")
        memo[key] = (n, e)                         # keep e alive: its id stays unique
    return memo[key][0]


@dataclass
class _RuleDFA:
    """A deterministic automaton for one rule: state 0 is the start."""
    byte_edges: list[list[tuple[int, int, int]]]   # per state: disjoint (lo, hi, target)
    call_edges: list[list[tuple[str, int]]]        # per state: (rule, target), one target per rule
    final: list[bool]


def _determinize(nfa: _NFA, start: int, accept: int, room: int | None = None) -> _RuleDFA:
    """Subset construction. `room`: how many states the budget has left for this rule."""
    budget = nfa.budget
    first = nfa.closure([start])
    ids = {first: 0}
    order = [first]
    byte_edges, call_edges, final = [], [], []
    for members in order:                          # `order` grows as new subsets appear
        # Byte edges: cut the byte range at every edge boundary, find each piece's targets.
        edges = [e for m in members for e in nfa.bytes[m]]
        cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
        out: list[tuple[int, int, int]] = []
        for a, b in zip(cuts, cuts[1:]):
            targets = [t for lo, hi, t in edges if lo <= a and b - 1 <= hi]
            if not targets:
                continue
            tid = _subset_id(nfa.closure(targets), ids, order)
            if out and out[-1][2] == tid and out[-1][1] == a - 1:
                out[-1] = (out[-1][0], b - 1, tid)   # merge neighbouring pieces with one target
            else:
                out.append((a, b - 1, tid))
        calls: dict[str, list[int]] = {}
        for m in members:
            for rule, t in nfa.calls[m]:
                calls.setdefault(rule, []).append(t)
        byte_edges.append(out)
        call_edges.append([(rule, _subset_id(nfa.closure(ts), ids, order)) for rule, ts in calls.items()])
        final.append(accept in members)
        if len(order) > MAX_DFA_STATES:
            raise GrammarError(f"rule {nfa.rule!r} needs over {MAX_DFA_STATES} automaton states; simplify it")
        if room is not None and len(order) > room:
            raise LimitExceeded("max_states", budget.max_states, "the grammar's automaton grows past "
                                f"{budget.max_states} states while rule {nfa.rule!r} is determinised")
        budget.check()
    return _RuleDFA(byte_edges, call_edges, final)


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
    trans: list[list[int]]              # position -> 256 targets (-1 = none)
    calls: list[tuple[tuple[int, int], ...]]
    final: list[bool]
    scannable: list[bool]               # has at least one byte edge
    pure_end: list[bool]                # final, no edges: returning here = returning from the rule
    root_start: int

    @property
    def num_positions(self) -> int:
        return len(self.trans)


INLINE_MAX_NODES = 400   # a rule whose (inlined) body is at most this big is copied into its callers


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


def _substitute(e: Expr, bodies: dict[str, Expr]) -> Expr:
    if isinstance(e, Ref):
        return bodies.get(e.name, e)
    if isinstance(e, Seq):
        return Seq(tuple(_substitute(i, bodies) for i in e.items))
    if isinstance(e, Alt):
        return Alt(tuple(_substitute(i, bodies) for i in e.items))
    if isinstance(e, Repeat):
        return Repeat(_substitute(e.item, bodies), e.min, e.max)
    return e


def inline_rules(grammar: Grammar, budget: CompileBudget | None = None) -> Grammar:
    """Copy small non-recursive rules into their callers (XGrammar inlines rules too).

    Why it matters for masks: a token can only be settled at compile time while it stays
    inside one rule. If a JSON string's characters are a rule of their own (`char ::= ...`,
    `string ::= "\"" char* "\""`), every token of two or more characters has to leave `char`
    and come back, so nearly the whole vocabulary would be "uncertain" inside strings. Inlined,
    the string is one automaton and those tokens are accepted or rejected ahead of time."""
    budget = budget or CompileBudget.unlimited()
    calls = {name: {r.name for r in refs_in(body)} for name, body in grammar.rules.items()}
    recursive = _recursive_rules(calls)
    bodies: dict[str, Expr] = {}     # rules already inlined, by name
    done: dict[str, Expr] = {}
    for name in _callees_first(calls, list(grammar.rules)):
        budget.check()
        body = done[name] = _substitute(grammar.rules[name], bodies)
        if name not in recursive and name != grammar.root and name not in grammar.keep \
                and _size_at_most(body, INLINE_MAX_NODES):
            bodies[name] = body
    # A rule inlined everywhere it was used is no longer needed.
    rules = {n: _substitute(done[n], bodies) for n in grammar.rules if n not in bodies}
    return Grammar(rules, grammar.root)


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


def _recursive_rules(calls: dict[str, set[str]]) -> set[str]:
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


def compile_automaton(grammar: Grammar, inline: bool = True, budget: CompileBudget | None = None) -> Automaton:
    """The position tables of a grammar. With a budget: refused before anything is built if the
    grammar needs more than max_states states, and stopped at the deadline or on cancel()."""
    budget = budget or CompileBudget.unlimited()
    if inline:
        grammar = inline_rules(grammar, budget)
    _check_size(grammar, budget)
    dfas: dict[str, _RuleDFA] = {}
    used = 0
    for name, body in grammar.rules.items():
        nfa = _NFA(name, budget)
        start, accept = nfa.new(), nfa.new()
        nfa.build(body, start, accept)
        room = None if budget.max_states is None else budget.max_states - used
        dfas[name] = _determinize(nfa, start, accept, room)
        used += len(dfas[name].final)
    base, names = {}, list(dfas)
    total = 0
    for name in names:
        base[name] = total
        total += len(dfas[name].final)
    trans, calls, final, rule_of = [], [], [], []
    for name in names:
        dfa, off = dfas[name], base[name]
        for st in range(len(dfa.final)):
            if st & 1023 == 0:
                budget.check()
            row = [-1] * 256
            for lo, hi, t in dfa.byte_edges[st]:
                row[lo:hi + 1] = [off + t] * (hi - lo + 1)
            trans.append(row)
            calls.append(tuple((base[r], off + t) for r, t in dfa.call_edges[st]))
            final.append(dfa.final[st])
            rule_of.append(name)
    scannable = [any(t >= 0 for t in row) for row in trans]
    pure_end = [final[p] and not scannable[p] and not calls[p] for p in range(total)]
    auto = Automaton(names, base, rule_of, trans, calls, final, scannable, pure_end, base[grammar.root])
    check_no_left_recursion(auto, budget)
    return auto


def _check_size(grammar: Grammar, budget: CompileBudget) -> None:
    """Refuse, before building anything, a rule over MAX_NFA_STATES states (always) or a grammar
    over the budget's max_states (its automaton has about as many positions as NFA states)."""
    memo: dict = {}
    sizes = {name: 2 + nfa_states(body, memo) for name, body in grammar.rules.items()}
    total = sum(sizes.values())
    biggest = max(sizes, key=sizes.get)
    budget.at_most("max_states", total, f"the grammar needs {total} automaton states (rule {biggest!r} "
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
    first_calls = {r: sorted({start_to_rule[c] for p in reachable_without_bytes(r, nullable) for c, _ in auto.calls[p]})
                   for r in auto.rule_names}
    # Depth-first search for a cycle in first_calls, with its own stack (a loop, not recursion).
    state: dict[str, int] = {}                     # 1 = on the DFS path, 2 = done
    for r in auto.rule_names:
        if r in state:
            continue
        state[r], path, stack = 1, [r], [iter(first_calls[r])]
        while stack:
            c = next(stack[-1], None)
            if c is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(c) == 1:
                cycle = path[path.index(c):] + [c]
                raise GrammarError("left recursion: " + " -> ".join(cycle) +
                                   " can repeat without consuming input; rewrite it with repetition "
                                   "(a ::= a \"x\" | \"y\"  becomes  a ::= \"y\" \"x\"*)")
            elif c not in state:
                state[c] = 1
                path.append(c)
                stack.append(iter(first_calls[c]))
