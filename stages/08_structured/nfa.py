"""One rule body -> a byte-level NFA (Thompson construction), and its size before it is built.

Character classes are expanded into UTF-8 byte sequences first (U+0080..U+07FF is two bytes,
[C2-DF][80-BF], and so on), so a token that ends inside a multi-byte character is no problem:
the automaton simply stops between two bytes of it. automaton.py makes the NFA deterministic.

**Shared sub-automata.** Inlining copies a small rule into every place that uses it, and a
JSON object's member chain uses each "rest of the members" rule two or three times:

    rest1 ::= ", " m1 rest2 | rest2          rest2 ::= ", " m2 rest3 | rest3    ...

Inlined naively, rest1 holds two copies of rest2, each holding two copies of rest3: the
automaton doubles with every optional property (changie's schema: 24,428 states). But both
copies of rest2 end where rest1 ends, and a sub-automaton is fully described by *what* it
matches and *where it goes next*. So the construction builds each (expression object, target
state) pair once and sends every later use there with an epsilon edge: the same language, the
same masks (the rule is still one automaton, so tokens stay inside it), states linear in the
chain (changie: 5,846). XGrammar's compiler shares structure too (its FSMs merge equivalent
states); this is the cheap case of it that needs no minimisation pass: identity of objects,
which inlining (inlining._substitute) preserves.

Sizes are known before anything is built: `nfa_states(expr)` counts exactly the states the
construction will create, sharing included (a repetition {m,n} still costs n copies of its
item: each copy goes somewhere else), so a runaway count is refused in microseconds.
"""
from __future__ import annotations

from functools import lru_cache

from .budget import CompileBudget
from .grammar import Alt, Bytes, CharClass, Expr, Ref, Repeat, Seq

MAX_NFA_STATES = 500_000   # beyond this a rule is almost surely a runaway repetition count

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


@lru_cache(maxsize=4096)
def _class_states(cls: CharClass) -> int:
    """States a class needs between its first and last byte: one per distinct remaining tail."""
    return len({seq[i:] for seq in class_sequences(cls) for i in range(1, len(seq))})


# ---------------------------------------------------------------- sharing
def shared_nodes(body: Expr) -> set[int]:
    """ids of the composite sub-expressions (Seq, Alt, Repeat) that the tree of `body` uses in
    more than one place: only these can be asked for twice with the same target."""
    uses: dict[int, int] = {}
    seen, todo = {id(body)}, [body]
    while todo:
        e = todo.pop()
        children = e.items if isinstance(e, (Seq, Alt)) else (e.item,) if isinstance(e, Repeat) else ()
        for c in children:
            if isinstance(c, (Seq, Alt, Repeat)):
                uses[id(c)] = uses.get(id(c), 0) + 1
            if id(c) not in seen:
                seen.add(id(c))
                todo.append(c)
    return {k for k, n in uses.items() if n > 1}


def _tail_items(e: Expr) -> tuple:
    """The parts of e that the construction builds towards e's own target state."""
    if isinstance(e, Seq):
        return e.items[-1:]
    if isinstance(e, Alt):
        return tuple(_literals_apart(e)[1])
    return ()


# ---------------------------------------------------------------- NFA (Thompson)
class _NFA:
    def __init__(self, rule: str, budget: CompileBudget):
        self.rule, self.budget = rule, budget
        self.eps: list[list[int]] = []
        self.bytes: list[list[tuple[int, int, int]]] = []
        self.calls: list[list[tuple[str, int]]] = []
        self._shared: set[int] = set()
        self._entries: dict[tuple[int, int], int] = {}   # (id of a shared expression, target) -> entry

    def new(self) -> int:
        if len(self.eps) & 1023 == 0:              # now and then: is the deadline past?
            self.budget.check()
        self.eps.append([])
        self.bytes.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def build(self, body: Expr, s: int, t: int) -> None:
        """Add edges so that the paths from s to t spell exactly the strings of `body` (a rule's
        whole body: sharing is found within it)."""
        self._shared, self._entries = shared_nodes(body), {}
        self._build(body, s, t)

    def _build(self, e: Expr, s: int, t: int) -> None:
        if id(e) in self._shared:                  # built towards t before? go there
            key = (id(e), t)
            entry = self._entries.get(key)
            if entry is not None:
                self.eps[s].append(entry)
                return
            entry = self._entries[key] = self.new()
            self.eps[s].append(entry)
            s = entry
        if isinstance(e, Bytes):
            cur = s
            for i, b in enumerate(e.value):
                nxt = t if i == len(e.value) - 1 else self.new()
                self.bytes[cur].append((b, b, nxt))
                cur = nxt
            if not e.value:
                self.eps[s].append(t)
        elif isinstance(e, CharClass):
            # Sequences that end alike share their last states: every 2-, 3- or 4-byte character
            # ends in the same "one continuation byte left" state, and so on.
            after = {(): t}                        # remaining byte ranges -> the state reading them
            for ranges in class_sequences(e):
                for i in range(len(ranges) - 1, 0, -1):
                    if ranges[i:] not in after:
                        after[ranges[i:]] = self.new()
                        a, b = ranges[i]
                        self.bytes[after[ranges[i:]]].append((a, b, after[ranges[i + 1:]]))
                a, b = ranges[0]
                self.bytes[s].append((a, b, after[ranges[1:]]))
        elif isinstance(e, Ref):
            self.calls[s].append((e.name, t))
        elif isinstance(e, Seq):
            cur = s
            for i, item in enumerate(e.items):
                nxt = t if i == len(e.items) - 1 else self.new()
                self._build(item, cur, nxt)
                cur = nxt
        elif isinstance(e, Alt):
            words, others = _literals_apart(e)
            inner, edges = literal_trie(words)
            ids = [s] + [self.new() for _ in range(inner)]
            for a, b, c in edges:
                self.bytes[ids[a]].append((b, b, t if c < 0 else ids[c]))
            for item in others:
                self._build(item, s, t)
        elif isinstance(e, Repeat):
            cur = s
            for _ in range(e.min):
                nxt = self.new()
                self._build(e.item, cur, nxt)
                cur = nxt
            if e.max is None:                      # a loop state: any number of further copies
                loop = self.new()
                self.eps[cur].append(loop)
                self._build(e.item, loop, loop)
                self.eps[loop].append(t)
            else:                                  # up to max-min optional copies
                for _ in range(e.max - e.min):
                    self.eps[cur].append(t)
                    nxt = self.new()
                    self._build(e.item, cur, nxt)
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


# ---------------------------------------------------------------- the count, before building
def nfa_states(body: Expr) -> int:
    """The number of states _NFA.build(body, s, t) creates (s and t not counted), computed from
    the expression alone. Building e towards a fresh target creates, for each distinct
    expression x among e and its *tail* parts (what is built towards that same target: a
    sequence's last item, an alternation's non-literal alternatives, recursively), x's own
    states plus an entry state if x is shared; x's other parts go to fresh targets of their
    own and are counted the same way."""
    return _Counter(shared_nodes(body)).fresh(body)


class _Counter:
    def __init__(self, shared: set[int]):
        self.shared = shared
        self.memo: dict[int, tuple[int, Expr]] = {}

    def fresh(self, e: Expr) -> int:
        """States created by building e towards a target nothing else was built towards."""
        hit = self.memo.get(id(e))
        if hit is None:
            group, todo = {id(e): e}, [e]
            while todo:                            # e and its tail parts, each once
                for x in _tail_items(todo.pop()):
                    if id(x) not in group:
                        group[id(x)] = x
                        todo.append(x)
            n = sum((id(x) in self.shared) + self.own(x) for x in group.values())
            hit = self.memo[id(e)] = (n, e)        # keep e alive: its id stays unique
        return hit[0]

    def own(self, e: Expr) -> int:
        """The states e creates itself, and those of its parts built towards fresh targets."""
        if isinstance(e, Bytes):
            return max(len(e.value) - 1, 0)
        if isinstance(e, CharClass):
            return _class_states(e)
        if isinstance(e, Ref):
            return 0
        if isinstance(e, Seq):
            return max(len(e.items) - 1, 0) + sum(self.fresh(it) for it in e.items[:-1])
        if isinstance(e, Alt):
            return literal_trie(_literals_apart(e)[0])[0]
        if isinstance(e, Repeat):
            copy = 1 + self.fresh(e.item)          # one copy of the item and the state after it
            return e.min * copy + (copy if e.max is None else (e.max - e.min) * copy)
        raise TypeError(f"not a grammar expression: {e!r}")
