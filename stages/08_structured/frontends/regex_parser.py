"""Regular expression -> grammar expression, for the subset that Python `re` and JavaScript agree on.

A regex is already a grammar, just written more tersely: every construct maps onto one of the
five grammar pieces, and none needs a rule of its own (a regex cannot recurse), so the result
is a single expression.

    abc                 Bytes(b"abc")              adjacent literals merge into one
    [a-z]  \\d  .        CharClass                  `.` is any character except newline
    x|y                 Alt                        an empty side (`a|`) is the empty string
    xy                  Seq
    x*  x{2,5}  x+?     Repeat                     lazy quantifiers match the same strings
    (x)  (?:x)  (?P<n>x)  just x                   captures only matter for match positions

The result describes *which strings match the whole pattern* (`re.fullmatch`), which is what
constrained generation needs; everything about *how* a match is found drops out. That is why
lazy and greedy quantifiers compile alike, and why `^` at the very start and `$` at the very
end may simply be ignored.

What drops out of the picture is also what we refuse. Backreferences (\\1), lookaround
((?=...)) and word boundaries (\\b) make a string's membership depend on context that a
grammar expression cannot see (\\1 is not even context-free), and inline flags ((?i)) or
possessive quantifiers are spelled or behave differently across engines. Each raises a
GrammarError naming the construct and its position, rather than silently matching something
else. So does a `{` that is not a quantifier: Python reads `a{x}` as literal text and
JavaScript (with the u flag) as an error, so we insist on `\\{`. A lone `}` or `]` is a literal,
as in both. Classes \\d \\w \\s have their ASCII meanings ([0-9], [A-Za-z0-9_], [ \\t\\n\\r\\f\\v]),
and `.` is any character but \\n, as in Python and JavaScript (xgrammar 0.2.8's own regex
converter lets `.` match \\n too: its `Grammar.from_regex('.')` prints [\\0-\\U0010ffff]).
"""
from __future__ import annotations

import re

from ..budget import CompileBudget, recursion_guard
from ..grammar import Bytes, CharClass, Expr, Grammar, GrammarError, alt, lit, repeat, seq

__all__ = ["parse_regex", "regex_to_grammar"]

_DIGIT = ((ord("0"), ord("9")),)
_WORD = ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("_"), ord("_")), (ord("a"), ord("z")))
_SPACE = ((ord("\t"), ord("\r")), (ord(" "), ord(" ")))  # \t \n \v \f \r and space
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_ANY_BUT_NEWLINE = CharClass.of([(ord("\n"), ord("\n"))], negated=True)
_BOUNDS = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_PLAIN_RUN = re.compile(r"[^\\^$.|?*+()\[\]{}]+")  # characters that stand for themselves
_GROUP_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)>")
# (?X... openings that are not plain or named groups: what they are, for the error message
_UNSUPPORTED_GROUPS = [("(?=", "lookahead (?=...)"), ("(?!", "negative lookahead (?!...)"),
                       ("(?<=", "lookbehind (?<=...)"), ("(?<!", "negative lookbehind (?<!...)"),
                       ("(?P=", "backreference (?P=name)"), ("(?#", "comment group (?#...)"),
                       ("(?>", "atomic group (?>...)"), ("(?(", "conditional group (?(...)...)")]
_UNSUPPORTED_ESCAPES = {"b": "word boundary \\b", "B": "non-boundary \\B", "A": "anchor \\A",
                        "Z": "anchor \\Z", "z": "anchor \\z", "G": "anchor \\G",
                        "k": "backreference \\k<name>", "p": "Unicode property \\p{...}",
                        "P": "Unicode property \\P{...}", "N": "named character \\N{...}",
                        "c": "control escape \\cX", "U": "escape \\U (Python only)"}


def parse_regex(pattern: str, budget: CompileBudget | None = None) -> Expr:
    """The grammar expression matching exactly the strings that `pattern` fully matches.
    `budget`: groups may nest at most max_depth deep, counts {m,n} go up to max_repeat."""
    with recursion_guard(f"the regex {pattern[:40]!r}"):
        return _RegexParser(pattern, budget or CompileBudget.unlimited()).parse()


def regex_to_grammar(pattern: str, budget: CompileBudget | None = None) -> Grammar:
    """A one-rule grammar (`root`) for `pattern` with full-match semantics."""
    return Grammar({"root": parse_regex(pattern, budget)})


class _RegexParser:
    def __init__(self, pattern: str, budget: CompileBudget):
        self.p = pattern
        self.pos = 0
        self.group_names: set[str] = set()
        self.budget = budget
        self.depth = 0  # groups open around the current position

    def error(self, message: str, pos: int | None = None) -> GrammarError:
        pos = self.pos if pos is None else pos
        return GrammarError(f"position {pos} in regex {self.p!r}: {message}")

    def peek(self, n: int = 1) -> str:
        return self.p[self.pos:self.pos + n]

    def parse(self) -> Expr:
        if self.peek() == "^":  # a no-op under full-match semantics
            self.pos += 1
        expr = self.alternation()
        if self.pos < len(self.p):  # alternation stops early only at a ')' with no '('
            raise self.error("unbalanced ')'")
        return expr

    # ------------------------------------------------------------------ structure
    def alternation(self) -> Expr:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return alt(*options)

    def sequence(self) -> Expr:
        items: list[Expr] = []
        text = bytearray()  # adjacent literals "a" "b" -> "ab": smaller automata
        while self.peek() not in ("", "|", ")"):
            self.budget.check()
            if self.peek() == "$":
                if self.pos != len(self.p) - 1:
                    raise self.error("'$' is only supported at the very end of the pattern")
                self.pos += 1
                continue
            run = self.literal_run()
            if run:
                text += run
                continue
            item = self.quantified()
            if isinstance(item, Bytes):
                text += item.value
                continue
            if text:
                items.append(Bytes(bytes(text)))
                text.clear()
            items.append(item)
        if text:
            items.append(Bytes(bytes(text)))
        return seq(*items)

    def literal_run(self) -> bytes:
        """Plain characters up to the next metacharacter, in one step (a pattern may be a long
        literal). The last one is left for quantified() if a quantifier follows it."""
        m = _PLAIN_RUN.match(self.p, self.pos)
        if not m:
            return b""
        end = m.end() - (m.end() < len(self.p) and self.p[m.end()] in "*+?{")
        try:
            run = self.p[self.pos:end].encode()
        except UnicodeEncodeError:  # a lone surrogate: quantified() reports where
            return b""
        self.pos = end
        return run

    def quantified(self) -> Expr:
        item = self.atom()
        bounds = self.quantifier()
        if bounds is None:
            return item
        if self.peek() == "?":      # lazy: a different match, the same set of strings
            self.pos += 1
        elif self.peek() == "+":
            raise self.error("possessive quantifiers (*+, ++, ?+, {m,n}+) are not supported")
        if self.quantifier(probe=True) is not None:
            raise self.error("multiple repeat: a quantifier cannot follow another (use a group)")
        return repeat(item, *bounds)

    def quantifier(self, probe: bool = False) -> tuple[int, int | None] | None:
        """Read * + ? {m} {m,} {m,n} here, or return None. probe=True only looks."""
        c = self.peek()
        if c in ("*", "+", "?"):
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            end = self.pos + 1
        elif c == "{":
            m = _BOUNDS.match(self.p, self.pos)
            if not m:
                raise self.error("'{' is not a valid quantifier {m}, {m,} or {m,n}; write \\{ for a literal brace")
            if max(len(m.group(1)), len(m.group(3) or "")) > 9:  # Python's re stops at 4294967295
                raise self.error(f"repetition count in {m.group()[:30]} is too large")
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else int(m.group(3)) if m.group(3) else None
            self.budget.at_most("max_repeat", max(lo, hi or 0),
                                f"the regex {self.p[:40]!r} repeats {max(lo, hi or 0)} times at position {self.pos}")
            if hi is not None and hi < lo:
                raise self.error(f"bad repetition bounds {m.group()}: the minimum exceeds the maximum")
            bounds, end = (lo, hi), m.end()
        else:
            return None
        if not probe:
            self.pos = end
        return bounds

    # ------------------------------------------------------------------ atoms
    def atom(self) -> Expr:
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            return _ANY_BUT_NEWLINE
        if c in ("*", "+", "?") or (c == "{" and _BOUNDS.match(self.p, self.pos)):
            raise self.error(f"nothing to repeat before {c!r}")
        if c == "{":
            raise self.error("'{' is not a valid quantifier {m}, {m,} or {m,n}; write \\{ for a literal brace")
        if c == "^":
            raise self.error("'^' is only supported at the very start of the pattern")
        if c == "\\":
            got = self.escape(in_class=False)
            return got if isinstance(got, CharClass) else self.literal(got, self.pos - 1)
        self.pos += 1
        return self.literal(c, self.pos - 1)

    def literal(self, ch: str, pos: int) -> Expr:
        try:
            return lit(ch)
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 text can contain it
            raise self.error(f"surrogate code point {ord(ch):#x} cannot appear in UTF-8 text", pos) from None

    def group(self) -> Expr:
        start = self.pos
        self.pos += 1
        self.depth += 1
        self.budget.at_most("max_depth", self.depth, f"the regex {self.p[:40]!r} nests groups "
                            f"{self.depth} deep at position {start}")
        if self.peek() == "?":
            self.group_prefix(start)
        inner = self.alternation()
        if self.peek() != ")":
            raise self.error(f"missing ')' to close the group opened at position {start}")
        self.pos += 1
        self.depth -= 1
        return inner

    def group_prefix(self, start: int) -> None:
        """Consume the (?: / (?P<name> / (?<name> prefix of a group, or raise for other (?..."""
        for opening, what in _UNSUPPORTED_GROUPS:
            if self.p.startswith(opening, start):
                raise self.error(f"{what} is not supported", start)
        if self.peek(2) == "?:":
            self.pos += 2
            return
        for opening in ("?P<", "?<"):
            if self.p.startswith(opening, self.pos):
                m = _GROUP_NAME.match(self.p, self.pos + len(opening))
                if not m:
                    raise self.error("bad group name (expected an identifier and '>')", start)
                if m.group(1) in self.group_names:
                    raise self.error(f"group name {m.group(1)!r} is used twice", start)
                self.group_names.add(m.group(1))
                self.pos = m.end()
                return
        if re.match(r"\?[a-zA-OQ-Z-]", self.p[self.pos:]):  # (?i) (?s-m:...) ... but not (?P
            raise self.error(f"inline flags {self.p[start:start + 4]!r}... are not supported", start)
        raise self.error(f"unknown group extension {self.p[start:start + 3]!r}", start)

    def char_class(self) -> Expr:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        if self.peek() == "]":  # Python: a literal ']'; JavaScript: the empty class. Refuse.
            raise self.error("']' first in a class means different things in Python and JavaScript; "
                             "write \\]")
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if self.peek() == "":
                raise self.error(f"unterminated character class opened at position {start}", start)
            item_pos = self.pos
            lo = self.class_item()
            if self.peek() == "-" and self.peek(2) not in ("-]", "-"):
                self.pos += 1
                hi = self.class_item()
                if isinstance(lo, CharClass) or isinstance(hi, CharClass):
                    raise self.error(f"bad character range {self.p[item_pos:self.pos]!r}", item_pos)
                if hi < lo:
                    raise self.error(f"bad character range {self.p[item_pos:self.pos]!r}: start after end",
                                     item_pos)
                ranges.append((lo, hi))
            elif isinstance(lo, CharClass):
                ranges.extend(lo.ranges)
            else:
                ranges.append((lo, lo))
        self.pos += 1
        return CharClass.of(ranges, negated)

    def class_item(self) -> int | CharClass:
        """One member of a class: a code point, or a whole class for \\d \\w \\s and friends."""
        if self.peek() == "\\":
            got = self.escape(in_class=True)
            return got if isinstance(got, CharClass) else ord(got)
        self.pos += 1
        return ord(self.p[self.pos - 1])

    def escape(self, in_class: bool) -> str | CharClass:
        """Consume a backslash escape: a character, or a class for \\d \\D \\w \\W \\s \\S."""
        start = self.pos
        c = self.p[self.pos + 1:self.pos + 2]
        self.pos += 2
        if c == "":
            raise self.error("trailing backslash", start)
        if c.lower() in _CLASS_ESCAPES:
            return CharClass.of(_CLASS_ESCAPES[c.lower()], negated=c.isupper())
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        if c == "b" and in_class:  # inside a class, both engines read \b as backspace
            return "\b"
        if c == "0":
            if self.peek().isdigit():
                raise self.error("octal escapes are not supported", start)
            return "\0"
        if c in "123456789":
            raise self.error(f"backreference \\{c} is not supported", start)
        if c in ("x", "u"):
            n = 2 if c == "x" else 4
            digits = self.peek(n)
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"bad escape: \\{c} needs exactly {n} hex digits", start)
            self.pos += n
            return chr(int(digits, 16))
        if c in _UNSUPPORTED_ESCAPES:
            raise self.error(f"{_UNSUPPORTED_ESCAPES[c]} is not supported", start)
        if c.isascii() and c.isalnum():
            raise self.error(f"unsupported escape \\{c}", start)
        return c  # an escaped metacharacter or punctuation: itself

