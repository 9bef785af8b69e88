"""The one grammar representation every front end (EBNF, regex, JSON Schema) compiles to.

A grammar is a set of named rules; a rule's body is an expression built from five pieces:

    Bytes(b"...")            a literal byte string (b"" matches the empty string)
    CharClass(ranges)        one Unicode character whose code point lies in the ranges
    Ref("name")              the rule `name` (the only piece that needs a stack)
    Seq(a, b, ...) / Alt(a, b, ...)
    Repeat(item, min, max)   item repeated min..max times (max None = unbounded)

Characters are code points here; the automaton (automaton.py) turns them into UTF-8 byte
sequences, so matching is on bytes and a token may end in the middle of a character.
The EBNF front end (frontends/ebnf.py) reads and writes this representation in xgrammar's
dialect: `to_ebnf(grammar)` is how a grammar is shown, and handed to xgrammar as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # not characters; UTF-8 never encodes them


class GrammarError(ValueError):
    """A grammar, regex or schema that cannot be compiled; the message says where and why."""


@dataclass(frozen=True)
class Bytes:
    value: bytes


@dataclass(frozen=True)
class CharClass:
    ranges: tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges

    @staticmethod
    def of(ranges, negated: bool = False) -> "CharClass":
        """Normalise (sort, merge, drop surrogates) and optionally complement over all characters."""
        merged: list[list[int]] = []
        for lo, hi in sorted((int(lo), int(hi)) for lo, hi in ranges):
            if lo > hi or lo < 0 or hi > MAX_CODEPOINT:
                raise GrammarError(f"bad character range {lo:#x}-{hi:#x}")
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        if negated:
            out, start = [], 0
            for lo, hi in merged:
                if lo > start:
                    out.append([start, lo - 1])
                start = hi + 1
            if start <= MAX_CODEPOINT:
                out.append([start, MAX_CODEPOINT])
            merged = out
        return CharClass(tuple(_without_surrogates(merged)))


def _without_surrogates(ranges):
    s_lo, s_hi = SURROGATES
    for lo, hi in ranges:
        if hi < s_lo or lo > s_hi:
            yield (lo, hi)
            continue
        if lo < s_lo:
            yield (lo, s_lo - 1)
        if hi > s_hi:
            yield (s_hi + 1, hi)


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    items: tuple


@dataclass(frozen=True)
class Repeat:
    item: "Expr"
    min: int
    max: int | None  # None = unbounded

    def __post_init__(self):
        if self.min < 0 or (self.max is not None and self.max < self.min):
            raise GrammarError(f"bad repetition bounds {{{self.min},{self.max}}}")


Expr = Union[Bytes, CharClass, Ref, Seq, Alt, Repeat]
EMPTY = Bytes(b"")


# Small constructors that keep trees flat; front ends build with these.
def lit(text: str | bytes) -> Bytes:
    return Bytes(text.encode() if isinstance(text, str) else text)


def chars(spec: str, negated: bool = False) -> CharClass:
    """chars("a-zA-Z_") -> a class; a '-' between two characters makes a range."""
    ranges, i = [], 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            ranges.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            ranges.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return CharClass.of(ranges, negated)


def seq(*items: Expr) -> Expr:
    flat = []
    for it in items:
        if isinstance(it, Seq):
            flat.extend(it.items)
        elif it != EMPTY:
            flat.append(it)
    return EMPTY if not flat else flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items: Expr) -> Expr:
    # A dict drops repeated alternatives in one pass and keeps their order (a list and `in`
    # would compare each new alternative with all earlier ones: minutes for a large enum).
    flat = list(dict.fromkeys(x for it in items for x in (it.items if isinstance(it, Alt) else (it,))))
    if not flat:
        raise GrammarError("an alternation needs at least one alternative")
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def repeat(item: Expr, lo: int, hi: int | None) -> Expr:
    if hi == 0:
        return EMPTY
    if lo == hi == 1:
        return item
    return Repeat(item, lo, hi)


def star(item: Expr) -> Expr:
    return repeat(item, 0, None)


def plus(item: Expr) -> Expr:
    return repeat(item, 1, None)


def opt(item: Expr) -> Expr:
    return repeat(item, 0, 1)


@dataclass
class Grammar:
    rules: dict[str, Expr] = field(default_factory=dict)
    root: str = "root"
    # What the source had to loosen or ignore to build this grammar (a JSON schema compiled in
    # best-effort mode, json_schema/); empty when the grammar is exactly what was asked for.
    warnings: tuple = field(default=(), compare=False)
    # Rules never inlined into their callers (inlining.py): big pieces that many callers
    # share, like the default-bounded string of json_schema/defaults.py.
    keep: frozenset = field(default=frozenset(), compare=False)
    # The source's leaf constraints, (expression, "KEYWORD at POINTER") (json_schema/): the largest
    # is named when a compile is refused for its size or stopped at its deadline.
    leaves: tuple = field(default=(), compare=False)

    def largest_part(self) -> str | None:
        """The leaf constraint with the most automaton states, as its rules are inlined."""
        from .inlining import _substitute
        from .nfa import nfa_states

        sized = [(nfa_states(_substitute(expr, self.rules, {})), where) for expr, where in self.leaves]
        if not sized:
            return None
        states, where = max(sized, key=lambda x: x[0])
        return f"{where}, {states:,} states"

    def __post_init__(self):   # a grammar is whole: its root and every rule it names exist
        if self.root not in self.rules:
            raise GrammarError(f"the grammar has no root rule {self.root!r}")
        missing = sorted({r.name for body in self.rules.values() for r in refs_in(body)} - set(self.rules))
        if missing:
            raise GrammarError(f"undefined rule(s): {', '.join(missing)}")


def refs_in(expr: Expr):
    """Every Ref inside `expr`, left to right (a loop, not recursion: no nesting overflows it)."""
    todo = [expr]
    while todo:
        e = todo.pop()
        if isinstance(e, Ref):
            yield e
        elif isinstance(e, (Seq, Alt)):
            todo.extend(reversed(e.items))
        elif isinstance(e, Repeat):
            todo.append(e.item)
