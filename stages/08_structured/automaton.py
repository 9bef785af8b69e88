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
"""
from __future__ import annotations

from dataclasses import dataclass

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


# ---------------------------------------------------------------- NFA (Thompson)
class _NFA:
    def __init__(self, rule: str):
        self.rule = rule
        self.eps: list[list[int]] = []
        self.bytes: list[list[tuple[int, int, int]]] = []
        self.calls: list[list[tuple[str, int]]] = []

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise GrammarError(f"rule {self.rule!r} is too large to compile (over {MAX_NFA_STATES} states); "
                               "lower its repetition counts")
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
            for lo, hi in e.ranges:
                for ranges in utf8_sequences(lo, hi):
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
            for item in e.items:
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


@dataclass
class _RuleDFA:
    """A deterministic automaton for one rule: state 0 is the start."""
    byte_edges: list[list[tuple[int, int, int]]]   # per state: disjoint (lo, hi, target)
    call_edges: list[list[tuple[str, int]]]        # per state: (rule, target), one target per rule
    final: list[bool]


def _determinize(nfa: _NFA, start: int, accept: int) -> _RuleDFA:
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


def _size(e: Expr) -> int:
    if isinstance(e, (Seq, Alt)):
        return 1 + sum(_size(i) for i in e.items)
    return 1 + _size(e.item) if isinstance(e, Repeat) else 1


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


def inline_rules(grammar: Grammar) -> Grammar:
    """Copy small non-recursive rules into their callers (XGrammar inlines rules too).

    Why it matters for masks: a token can only be settled at compile time while it stays
    inside one rule. If a JSON string's characters are a rule of their own (`char ::= ...`,
    `string ::= "\"" char* "\""`), every token of two or more characters has to leave `char`
    and come back, so nearly the whole vocabulary would be "uncertain" inside strings. Inlined,
    the string is one automaton and those tokens are accepted or rejected ahead of time."""
    calls = {name: {r.name for r in refs_in(body)} for name, body in grammar.rules.items()}
    bodies: dict[str, Expr] = {}     # rules already inlined, by name
    done: dict[str, Expr] = {}

    def visit(name: str, path: set[str]) -> None:
        if name in done:
            return
        path.add(name)
        for callee in calls[name]:
            if callee not in path:
                visit(callee, path)
        path.discard(name)
        body = _substitute(grammar.rules[name], bodies)
        done[name] = body
        recursive = name in _reachable(name, calls)
        if not recursive and name != grammar.root and _size(body) <= INLINE_MAX_NODES:
            bodies[name] = body

    for name in grammar.rules:
        visit(name, set())
    # A rule inlined everywhere it was used is no longer needed.
    rules = {n: _substitute(done[n], bodies) for n in grammar.rules if n not in bodies}
    return Grammar(rules, grammar.root)


def _reachable(start: str, calls: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), list(calls[start])
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            todo.extend(calls[r])
    return seen


def compile_automaton(grammar: Grammar, inline: bool = True) -> Automaton:
    if inline:
        grammar = inline_rules(grammar)
    dfas: dict[str, _RuleDFA] = {}
    for name, body in grammar.rules.items():
        nfa = _NFA(name)
        start, accept = nfa.new(), nfa.new()
        nfa.build(body, start, accept)
        dfas[name] = _determinize(nfa, start, accept)
    base, names = {}, list(dfas)
    total = 0
    for name in names:
        base[name] = total
        total += len(dfas[name].final)
    trans, calls, final, rule_of = [], [], [], []
    for name in names:
        dfa, off = dfas[name], base[name]
        for st in range(len(dfa.final)):
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
    check_no_left_recursion(auto)
    return auto


def check_no_left_recursion(auto: Automaton) -> None:
    """A rule that can reach itself without consuming a byte (a ::= a "x" | ...) would make the
    pushdown automaton push forever. Find such cycles and name them."""
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
            if r not in nullable and any(auto.final[p] for p in reachable_without_bytes(r, nullable)):
                nullable.add(r)
                changed = True
    first_calls = {r: {start_to_rule[c] for p in reachable_without_bytes(r, nullable) for c, _ in auto.calls[p]}
                   for r in auto.rule_names}
    state: dict[str, int] = {}                     # 1 = on the DFS path, 2 = done

    def visit(r: str, path: list[str]) -> None:
        state[r] = 1
        for c in sorted(first_calls[r]):
            if state.get(c) == 1:
                cycle = path[path.index(c):] + [c]
                raise GrammarError("left recursion: " + " -> ".join(cycle) +
                                   " can repeat without consuming input; rewrite it with repetition "
                                   "(a ::= a \"x\" | \"y\"  becomes  a ::= \"y\" \"x\"*)")
            if c not in state:
                visit(c, path + [c])
        state[r] = 2

    for r in auto.rule_names:
        if r not in state:
            visit(r, [r])
