"""The leaf grammars of the JSON Schema front end: pieces that depend on no schema structure. Integer
ranges, the characters and escapes of JSON strings, formats, regex patterns made safe inside a
JSON string, escapes allowed in extra property names, and the shared helper rules (value,
object, string, ...). Also `matches`: does a literal fit a piece?"""
from __future__ import annotations

import bisect

from ..grammar import (EMPTY, Alt, Bytes, CharClass, Expr, Ref, Repeat, Seq, alt, chars, lit, opt, plus, repeat,
                      seq, star)

FORMATS = ("date", "time", "date-time", "uuid", "ipv4", "ipv6", "email", "hostname", "uri")
# Formats whose grammar is looser than the format's definition (best-effort mode warns; strict
# mode refuses them): what is not enforced.
LOOSE_FORMATS = {"hostname": "label lengths (at most 63) and the total length (at most 253) are not bounded"}

NEVER = CharClass(())  # matches nothing: `false`, an impossible required member, ...
DIGIT, NONZERO, HEX = chars("0-9"), chars("1-9"), chars("0-9a-fA-F")
# A raw string character: anything but '"', '\' and the control characters U+0000-U+001F.
PLAIN = CharClass.of([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)])
SIMPLE_ESCAPES = chars('"\\/bfnrt')


# ------------------------------------------------------------------ grammar pieces that know NEVER
def seq_or_never(*items: Expr) -> Expr:
    """seq(), but anything followed by the impossible is impossible; adjacent literals merge."""
    if NEVER in items:
        return NEVER
    out = seq(*items)
    if isinstance(out, Seq):
        merged: list[Expr] = []
        for it in out.items:
            if merged and isinstance(it, Bytes) and isinstance(merged[-1], Bytes):
                merged[-1] = Bytes(merged[-1].value + it.value)
            else:
                merged.append(it)
        out = merged[0] if len(merged) == 1 else Seq(tuple(merged))
    return out


def alt_or_never(*items: Expr) -> Expr:
    live = [it for it in items if it != NEVER]
    return alt(*live) if live else NEVER


def repeat_or_never(item: Expr, lo: int, hi: int | None) -> Expr:
    if item == NEVER:
        return EMPTY if lo == 0 else NEVER
    return repeat(item, lo, hi)


def class_minus(cls: CharClass, points) -> Expr:
    """The class without the given code points (NEVER if nothing is left)."""
    holes = CharClass.of([(p, p) for p in points], negated=True)  # everything but the points
    kept = [(max(lo, a), min(hi, b)) for lo, hi in cls.ranges for a, b in holes.ranges
            if max(lo, a) <= min(hi, b)]
    return CharClass.of(kept) if kept else NEVER


# ------------------------------------------------------------------ integers in a range
MAX_DIGITS = 1000  # beyond this a bound is refused even without a budget (str() refuses 4300)


def digit_count(number: float) -> int:
    """Decimal digits of a number's integer part, without writing out a huge integer."""
    n = abs(int(number))
    return len(str(n)) if n.bit_length() <= 4 * MAX_DIGITS else int(n.bit_length() * 0.30103) + 1


def integer_range(lo: int | None, hi: int | None) -> Expr:
    """Exactly the canonical spellings of the integers in [lo, hi] (None = unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        return NEVER
    parts = []
    if lo is None or lo < 0:    # negatives: "-" and a magnitude
        mag_lo = -hi if hi is not None and hi < 0 else 1
        parts.append(seq_or_never(lit("-"), _positive_range(mag_lo, None if lo is None else -lo)))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append(lit("0"))
    if hi is None or hi > 0:
        parts.append(_positive_range(max(lo, 1) if lo is not None else 1, hi))
    return alt_or_never(*parts)


def _positive_range(a: int, b: int | None) -> Expr:
    """Integers a..b (a >= 1), split by number of digits: each length is a range of equal-length
    digit strings; past b's length (b None) any longer number will do."""
    if b is not None and b < a:
        return NEVER
    if b is None and str(a) == "1" + "0" * (len(str(a)) - 1):  # 1, 10, 100, ...: any longer will do
        return seq_or_never(NONZERO, repeat(DIGIT, len(str(a)) - 1, None))
    longest = len(str(b)) if b is not None else len(str(a))
    parts = [_same_length(str(max(a, 10 ** (n - 1))), str(min(b, 10 ** n - 1) if b is not None else 10 ** n - 1))
             for n in range(len(str(a)), longest + 1)]
    if b is None:
        parts.append(seq_or_never(NONZERO, repeat(DIGIT, len(str(a)), None)))
    return alt_or_never(*parts)


def _same_length(x: str, y: str) -> Expr:
    """Digit strings from x to y, both of the same length: share the common first digit, or split
    into [x..x9999], [x0+1 .. y0-1] followed by any digits, [y0000..y]."""
    if x == y:
        return lit(x)
    if len(x) == 1:
        return chars(f"{x}-{y}")
    if x[0] == y[0]:
        return seq_or_never(lit(x[0]), _same_length(x[1:], y[1:]))
    rest = len(x) - 1
    low_full, high_full = x[1:] == "0" * rest, y[1:] == "9" * rest
    first, last = int(x[0]) + (0 if low_full else 1), int(y[0]) - (0 if high_full else 1)
    parts = []
    if not low_full:
        parts.append(seq_or_never(lit(x[0]), _same_length(x[1:], "9" * rest)))
    if first <= last:
        parts.append(seq_or_never(chars(f"{first}-{last}"), repeat(DIGIT, rest, rest)))
    if not high_full:
        parts.append(seq_or_never(lit(y[0]), _same_length("0" * rest, y[1:])))
    return alt_or_never(*parts)


# ------------------------------------------------------------------ escapes in extra property names
_SHORT_ESCAPES = {"\"": '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def safe_escape(used: set[int]) -> Expr:
    """What may follow a backslash in an extra key: escapes of characters in no declared name.
    (If a name has a character beyond U+FFFF, no surrogate \\u escape is safe: a pair of
    them could spell it.)"""
    short = [ord(k) for k, v in _SHORT_ESCAPES.items() if ord(v) not in used]
    banned = sorted(used | (set(range(0xD800, 0xE000)) if max(used, default=0) > 0xFFFF else set()))
    return alt_or_never(CharClass.of([(c, c) for c in short]) if short else NEVER,
                seq_or_never(lit("u"), _hex_excluding(banned, 0, 4)))


def _hex_excluding(banned: list[int], base: int, digits: int) -> Expr:
    """`digits` hex digits (either case) spelling a number in [base, base + 16**digits) that is
    not in the sorted list `banned`: free leading digits share one class, the rest recurse."""
    if digits == 0:
        return EMPTY
    size, free, parts = 16 ** (digits - 1), [], []
    for d in range(16):
        lo = base + d * size
        hits = bisect.bisect_left(banned, lo + size) - bisect.bisect_left(banned, lo)
        if hits == 0:
            free.append(d)
        elif hits < size:
            parts.append(seq_or_never(_hex_digits([d]), _hex_excluding(banned, lo, digits - 1)))
    if free:
        parts.insert(0, seq_or_never(_hex_digits(free), repeat(HEX, digits - 1, digits - 1)))
    return alt_or_never(*parts)


def _hex_digits(values) -> CharClass:
    return CharClass.of([(ord(c), ord(c)) for v in values for c in {f"{v:x}", f"{v:X}"}])


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def in_class(cls: CharClass, ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in cls.ranges)


# ------------------------------------------------------------------ patterns inside JSON strings
def top_level_alternatives(pattern: str) -> list[str]:
    """Split on '|' outside groups and classes: anchors belong to one alternative each."""
    out, start, depth, in_class, i = [], 0, 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return out + [pattern[start:]]


def ends_with_anchor(branch: str) -> bool:
    if not branch.endswith("$"):
        return False
    backslashes = len(branch[:-1]) - len(branch[:-1].rstrip("\\"))
    return backslashes % 2 == 0  # "\$" is a literal dollar


NEEDS_ESCAPE = [ord('"'), ord("\\")] + list(range(0x20))


def json_safe(expr: Expr) -> Expr:
    """Drop the characters that would need escaping in a JSON string (stricter, documented)."""
    if isinstance(expr, CharClass):
        return class_minus(expr, NEEDS_ESCAPE) if expr.ranges else NEVER
    if isinstance(expr, Bytes):
        return NEVER if any(b < 0x20 or b in b'"\\' for b in expr.value) else expr
    if isinstance(expr, Seq):
        return seq_or_never(*map(json_safe, expr.items))
    if isinstance(expr, Alt):
        return alt_or_never(*map(json_safe, expr.items))
    if isinstance(expr, Repeat):
        return repeat_or_never(json_safe(expr.item), expr.min, expr.max)
    return expr


# ------------------------------------------------------------------ does a literal match a piece?
class PendingRule(Exception):
    """matches() reached a $ref rule that is still being built."""


def matches(rules: dict, expr: Expr, text: str) -> bool:
    """Whole-string match of `text` against an expression of this grammar, by the set of
    end positions each piece can reach (exact; fine for the short literals of enums). `rules`
    gives the bodies of the rules a Ref names (None: still being built)."""
    memo: dict = {}

    def ends(e: Expr, i: int) -> frozenset:
        key = (id(e), i)
        if key in memo:
            return memo[key] or frozenset()
        memo[key] = None  # in progress; our grammars have no left recursion
        if isinstance(e, Bytes):
            s = e.value.decode()
            out = frozenset([i + len(s)]) if text.startswith(s, i) else frozenset()
        elif isinstance(e, CharClass):
            ok = i < len(text) and any(lo <= ord(text[i]) <= hi for lo, hi in e.ranges)
            out = frozenset([i + 1]) if ok else frozenset()
        elif isinstance(e, Ref):
            body = rules.get(e.name)
            if body is None:
                raise PendingRule(e.name)
            out = ends(body, i)
        elif isinstance(e, Seq):
            at = frozenset([i])
            for item in e.items:
                at = frozenset(j for p in at for j in ends(item, p))
            out = at
        elif isinstance(e, Alt):
            out = frozenset(j for item in e.items for j in ends(item, i))
        else:
            out = _repeat_ends(e, i, ends)
        memo[key] = out
        return out

    return len(text) in ends(expr, 0)


def _repeat_ends(e: Repeat, i: int, ends) -> frozenset:
    at = {i}
    for _ in range(e.min):
        at = {j for p in at for j in ends(e.item, p)}
    reached, frontier, count = set(at), set(at), e.min
    while frontier and (e.max is None or count < e.max):
        # a position reached again later has no more budget left than before: skip it
        frontier = {j for p in frontier for j in ends(e.item, p)} - reached
        reached |= frontier
        count += 1
    return frozenset(reached)


# ------------------------------------------------------------------ the shared helper rules
def _formats():
    """RFC 3339 dates and times (as Python's validators read them), uuid, dotted-quad ipv4."""
    d = DIGIT
    year = alt(seq_or_never(NONZERO, repeat(d, 3, 3)), seq_or_never(lit("0"), NONZERO, d, d),
               seq_or_never(lit("00"), NONZERO, d), seq_or_never(lit("000"), NONZERO))  # 0001-9999
    div4 = alt(seq_or_never(lit("0"), chars("48")), seq_or_never(chars("2468"), chars("048")), seq_or_never(chars("13579"), chars("26")))
    leap_year = alt(seq_or_never(d, d, div4), seq_or_never(div4, lit("00")))  # 1600 2000 2024, not 1900 or 0000
    day28 = alt(seq_or_never(lit("0"), NONZERO), seq_or_never(lit("1"), d), seq_or_never(lit("2"), chars("0-8")))
    date = alt(seq_or_never(year, lit("-"), alt(
        seq_or_never(alt(seq_or_never(lit("0"), chars("13578")), seq_or_never(lit("1"), chars("02"))), lit("-"), alt(day28, lit("29"), lit("30"), lit("31"))),
        seq_or_never(alt(seq_or_never(lit("0"), chars("469")), lit("11")), lit("-"), alt(day28, lit("29"), lit("30"))),
        seq_or_never(lit("02-"), day28))),
        seq_or_never(leap_year, lit("-02-29")))
    hour, minute = alt(seq_or_never(chars("01"), d), seq_or_never(lit("2"), chars("0-3"))), seq_or_never(chars("0-5"), d)
    time = seq_or_never(hour, lit(":"), minute, lit(":"), minute, opt(seq_or_never(lit("."), plus(d))),
                alt(chars("Zz"), seq_or_never(chars("+-"), hour, lit(":"), minute)))
    octet = alt(seq_or_never(lit("25"), chars("0-5")), seq_or_never(lit("2"), chars("0-4"), d), seq_or_never(lit("1"), d, d),
                seq_or_never(NONZERO, d), d)
    hexes = [repeat(HEX, n, n) for n in (8, 4, 4, 4, 12)]
    uuid = seq_or_never(hexes[0], lit("-"), hexes[1], lit("-"), hexes[2], lit("-"), hexes[3], lit("-"), hexes[4])
    return {"format_date": lambda c: date, "format_time": lambda c: time,
            "format_date_time": lambda c: seq_or_never(c.helper("format_date"), chars("Tt"), c.helper("format_time")),
            "format_uuid": lambda c: uuid,
            "format_ipv4": lambda c: seq_or_never(*[x for _ in range(3) for x in (octet, lit("."))], octet),
            **{f"format_{name}": (lambda c, regex=regex: _format_regex(regex))
               for name, regex in _FORMAT_REGEXES.items()}}


# Formats written as regexes, following xgrammar 0.2.8's grammars for them (so the masks can be
# compared), with two changes where xgrammar's would write invalid output: an email's quoted
# local part ("a b"@x.org, whose inner escapes xgrammar gets wrong) is left out, and the IPv4
# tail of an IPv6 address has no leading zeros (Python's ipaddress refuses "::1.02.3.4").
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"({_OCTET}\.){{3}}{_OCTET}"
_H16, _PCT = "[0-9a-fA-F]{1,4}", "%[0-9A-Fa-f][0-9A-Fa-f]"
_PCHAR = f"([a-zA-Z0-9_.~!$&'()*+,;=:@-]|{_PCT})"
_FORMAT_REGEXES = {
    "email": r"[a-zA-Z0-9_!#$%&'*+/=?^`{|}~-]+(\.[a-zA-Z0-9_!#$%&'*+/=?^`{|}~-]+)*"
             r"@[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9])*",
    "hostname": r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*",
    "ipv6": "|".join([
        f"({_H16}:){{7}}{_H16}", f"({_H16}:){{1,7}}:", f"({_H16}:){{1,6}}:{_H16}",
        f"({_H16}:){{1,5}}(:{_H16}){{1,2}}", f"({_H16}:){{1,4}}(:{_H16}){{1,3}}",
        f"({_H16}:){{1,3}}(:{_H16}){{1,4}}", f"({_H16}:){{1,2}}(:{_H16}){{1,5}}",
        f"{_H16}:(:{_H16}){{1,6}}", f":((:{_H16}){{1,7}}|:)",
        f"::(ffff(:0{{1,4}})?:)?{_IPV4}", f"({_H16}:){{1,4}}:{_IPV4}"]),
    # scheme ":" then "//" authority path, or a path; then ?query and #fragment (RFC 3986's
    # shape; like xgrammar, no digits in the scheme after its first letter)
    "uri": (r"[a-zA-Z][a-zA-Z+.-]*:"
            rf"(//(([a-zA-Z0-9_.~!$&'()*+,;=:-]|{_PCT})*@)?([a-zA-Z0-9_.~!$&'()*+,;=-]|{_PCT})*(:[0-9]*)?"
            rf"(/{_PCHAR}*)*|/?({_PCHAR}+(/{_PCHAR}*)*)?)"
            rf"(\?([a-zA-Z0-9_.~!$&'()*+,;=:@/?-]|{_PCT})*)?(#([a-zA-Z0-9_.~!$&'()*+,;=:@/?-]|{_PCT})*)?"),
}


def _format_regex(regex: str) -> Expr:
    from ..frontends.regex_parser import parse_regex  # (regex_parser needs nothing from here)

    return parse_regex(regex)


# The shared rules by name, built once each by the converter `c` (c.helper(name) refers to one).
HELPERS = {
    "value": lambda c: alt(c.helper("object"), c.helper("array"), c.helper("string"), c.helper("number"),
                           lit("true"), lit("false"), lit("null")),
    "object": lambda c: seq_or_never(lit("{"), opt(seq_or_never(c.helper("member"), star(seq_or_never(lit(", "), c.helper("member"))))),
                             lit("}")),
    "member": lambda c: seq_or_never(c.helper("string"), lit(": "), c.helper("value")),
    "array": lambda c: seq_or_never(lit("["), opt(seq_or_never(c.helper("value"), star(seq_or_never(lit(", "), c.helper("value"))))),
                            lit("]")),
    "string": lambda c: seq_or_never(lit('"'), star(c.helper("char")), lit('"')),
    "char": lambda c: alt(PLAIN, seq_or_never(lit("\\"), c.helper("escape"))),
    "escape": lambda c: alt(SIMPLE_ESCAPES, seq_or_never(lit("u"), repeat(HEX, 4, 4))),
    # for counting characters: a \u escape of half a surrogate pair is not a whole one
    "one_char": lambda c: alt(PLAIN, seq_or_never(lit("\\"), alt(SIMPLE_ESCAPES, seq_or_never(lit("u"), _hex_excluding(
        list(range(0xD800, 0xE000)), 0, 4))))),
    "number": lambda c: seq_or_never(opt(lit("-")), alt(lit("0"), seq_or_never(NONZERO, star(DIGIT))),
                             opt(seq_or_never(lit("."), plus(DIGIT))), opt(seq_or_never(chars("eE"), opt(chars("+-")), plus(DIGIT)))),
    "integer": lambda c: alt(lit("0"), seq_or_never(opt(lit("-")), NONZERO, star(DIGIT))),
    **_formats(),
}
