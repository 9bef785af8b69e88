"""EBNF text <-> Grammar: a recursive-descent parser for the GBNF dialect (llama.cpp, xgrammar),
and the printer that writes any grammar in it (`to_ebnf`).

    root   ::= value                    # a rule: name ::= expression
    value  ::= "null" | number | "[" ws ( value ( "," ws value )* )? "]"
    number ::= "-"? [0-9]+
               ( "." [0-9]+ )?          # a rule continues until the next `name ::=`
    ws     ::= [ \\t\\n]*

Expressions are built from five kinds of atoms and three operators, by increasing precedence:

    "text"  [a-z]  [^"\\\\]  name  ( ... )      atoms: literal, class, negated class, rule, group
    a | b                                     alternation (lowest)
    a b                                       sequence (juxtaposition)
    a*  a+  a?  a{m}  a{m,}  a{m,n}           repetition (postfix, highest; one per atom)

A recursive-descent parser has one function per precedence level, each calling the next one
down: `alternation` reads sequences separated by '|', `sequence` reads postfixed atoms until
something that cannot continue it, `postfixed` reads an atom and an optional operator, and
`atom` handles a parenthesised group by calling `alternation` again -- that recursion is what
lets groups nest. The one subtle point of this dialect is that a rule body may span lines, so
a sequence ends where the next rule begins: at a name followed by '::='. We look two tokens
ahead (name, then '::=') to tell `a ::=` (a new rule) from `a` (a reference inside the body).

Strings and classes take the escapes \\n \\r \\t \\" \\\\ \\' \\xHH \\uHHHH \\UHHHHHHHH (all of them code
points: "\\xff" is the character U+00FF, stored as its two UTF-8 bytes); classes also take
\\] \\[ \\- \\^. xgrammar's lookahead assertions `(= ...)` are refused.

Errors say where (line and column, 1-based) and what, because a grammar author's only way to
find a typo is the message: `line 3, col 12: expected '::=' after rule name 'value', found '= "x"'`.
"""
from __future__ import annotations

import re

from ..grammar import (MAX_CODEPOINT, SURROGATES, Alt, Bytes, CharClass, Expr, Grammar, GrammarError, Ref, Repeat,
                       Seq, alt, lit, repeat, seq)

__all__ = ["expr_to_ebnf", "parse_ebnf", "to_ebnf"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_NUMBER = re.compile(r"[0-9]+")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "'": "'"}
_CLASS_ESCAPES = {**_SIMPLE_ESCAPES, "]": "]", "[": "[", "-": "-", "^": "^"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}  # escape letter -> number of hex digits


def parse_ebnf(text: str, root: str = "root") -> Grammar:
    """Parse GBNF/xgrammar-style EBNF into a Grammar whose start rule is `root`."""
    return _Parser(text).grammar(root)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.first_use: dict[str, int] = {}  # rule name -> position of its first reference
        self.last_ref = ("", -1)              # the latest reference read and where it ended

    # ------------------------------------------------------------------ errors and scanning
    def where(self, pos: int) -> str:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"line {line}, col {col}"

    def error(self, message: str, pos: int | None = None, show: bool = True) -> GrammarError:
        """An error at `pos` (default: here), quoting the text found there unless show=False."""
        pos = self.pos if pos is None else pos
        if show:
            rest = self.text[pos:].split("\n", 1)[0]
            found = f"found {rest[:20]!r}" if rest else "found end of line" if pos < len(self.text) \
                else "found end of input"
            message = f"{message}, {found}"
        return GrammarError(f"{self.where(pos)}: {message}")

    def skip_space(self) -> None:
        """Skip whitespace (newlines included) and # comments."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name_here(self) -> str | None:
        m = _NAME.match(self.text, self.pos)
        return m.group() if m else None

    def at_rule_start(self) -> bool:
        """Is the text here `name ::=`? (Two-token lookahead; the position does not move.)"""
        name = self.name_here()
        if name is None:
            return False
        save = self.pos
        self.pos += len(name)
        self.skip_space()
        found = self.text.startswith("::=", self.pos)
        self.pos = save
        return found

    # ------------------------------------------------------------------ grammar and rules
    def grammar(self, root: str) -> Grammar:
        rules: dict[str, Expr] = {}
        defined_at: dict[str, int] = {}
        self.skip_space()
        if self.pos == len(self.text):
            raise GrammarError("empty grammar: the text defines no rules (write e.g. root ::= \"a\")")
        while self.pos < len(self.text):
            start = self.pos
            name = self.name_here()
            if name is None:
                raise self.error("expected a rule name")
            if name in rules:
                raise self.error(f"rule {name!r} is defined twice (first at {self.where(defined_at[name])})",
                                 start, show=False)
            self.pos += len(name)
            self.skip_space()
            if not self.text.startswith("::=", self.pos):
                raise self.error(f"expected '::=' after rule name {name!r}")
            self.pos += 3
            self.skip_space()
            rules[name], defined_at[name] = self.alternation(), start
            if self.peek() == ")":  # the only thing that stops a body early
                raise self.error("unbalanced ')'")
        for ref, pos in self.first_use.items():  # checked here (not by validate) to report where
            if ref not in rules:
                raise self.error(f"undefined rule {ref!r}", pos, show=False)
        if root not in rules:
            raise GrammarError(f"the grammar has no root rule {root!r} (it defines {', '.join(rules)})")
        return Grammar(rules, root)

    # ------------------------------------------------------------------ expressions
    def alternation(self) -> Expr:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space()
            options.append(self.sequence())
        return alt(*options)

    def sequence(self) -> Expr:
        items = []
        while self.peek() not in ("", "|", ")") and not self.at_rule_start():
            items.append(self.postfixed())
        if not items:  # e.g. `a ::= | b`, `()`, or a body that is missing
            raise self.error('expected an expression (write "" for the empty string)')
        return seq(*items)

    def postfixed(self) -> Expr:
        item = self.atom()
        self.skip_space()
        c, start = self.peek(), self.pos
        if c in ("*", "+", "?"):
            self.pos += 1
            item = repeat(item, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
        elif c == "{":
            item = repeat(item, *self.bounds())
        else:
            return item
        self.skip_space()
        if self.peek() in ("*", "+", "?", "{"):
            raise self.error(f"a repetition cannot follow another (after {self.text[start:self.pos].strip()!r}); "
                             "use parentheses")
        return item

    def bounds(self) -> tuple[int, int | None]:
        """{m} {m,} {m,n}, spaces allowed inside the braces."""
        start = self.pos
        self.pos += 1
        lo = hi = self.number()
        self.skip_space()
        if self.peek() == ",":
            self.pos += 1
            self.skip_space()
            hi = None if self.peek() == "}" else self.number()
        self.skip_space()
        if self.peek() != "}":
            raise self.error("expected '}' to close the repetition bounds")
        self.pos += 1
        if hi is not None and hi < lo:
            raise self.error(f"bad repetition bounds {self.text[start:self.pos]}: the minimum exceeds the maximum",
                             start, show=False)
        return lo, hi

    def number(self) -> int:
        self.skip_space()
        m = _NUMBER.match(self.text, self.pos)
        if not m:
            raise self.error("expected a number in repetition bounds")
        self.pos = m.end()
        return int(m.group())

    def atom(self) -> Expr:
        c, start = self.peek(), self.pos
        if c == '"':
            return self.string()
        if c == "[":
            return self.char_class()
        if c == "(":
            self.pos += 1
            self.skip_space()
            if self.peek() == "=":
                raise self.error("lookahead assertions '(= ...)' are not supported", start, show=False)
            inner = self.alternation()
            if self.peek() != ")":
                raise self.error(f"expected ')' to close the group opened at {self.where(start)}")
            self.pos += 1
            return inner
        name = self.name_here()
        if name is not None:
            self.first_use.setdefault(name, start)
            self.pos += len(name)
            self.last_ref = (name, self.pos)
            return Ref(name)
        if c == "'":
            raise self.error("string literals use double quotes")
        name, end = self.last_ref
        if name and c in (":", "=") and not self.text[end:start].strip():  # `value = ...`: a mistyped rule start
            raise self.error(f"expected '::=' after rule name {name!r}")
        raise self.error(f"unexpected {c!r}: expected a string, a character class, a rule name or '('")

    # ------------------------------------------------------------------ literals
    def string(self) -> Expr:
        start = self.pos
        self.pos += 1
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n"):
                raise self.error("unterminated string literal", start)
            if c == '"':
                self.pos += 1
                break
            out.append(self.char(_SIMPLE_ESCAPES, "string literal"))
        if any(SURROGATES[0] <= ord(ch) <= SURROGATES[1] for ch in out):
            raise self.error("a string literal cannot contain a surrogate code point", start)
        return lit("".join(out))

    def char_class(self) -> Expr:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if self.peek() in ("", "\n"):
                raise self.error("unterminated character class", start)
            item_pos = self.pos
            lo = ord(self.char(_CLASS_ESCAPES, "character class"))
            hi = lo
            if self.peek() == "-" and self.text[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.pos += 1
                if self.peek() == "\n":
                    raise self.error("unterminated character class", start)
                hi = ord(self.char(_CLASS_ESCAPES, "character class"))
                if hi < lo:
                    raise self.error(f"bad range {self.text[item_pos:self.pos]!r} in character class: "
                                     "the start is after the end", item_pos, show=False)
            ranges.append((lo, hi))
        self.pos += 1
        if not ranges:
            raise self.error("empty character class (write \\] for a literal ']')", start, show=False)
        return CharClass.of(ranges, negated)

    def char(self, escapes: dict[str, str], where: str) -> str:
        """One character of a string or class, decoding a backslash escape."""
        c = self.peek()
        if c != "\\":
            self.pos += 1
            return c
        start = self.pos
        e = self.text[self.pos + 1:self.pos + 2]
        if e in ("", "\n"):
            raise self.error(f"unterminated {where}", start)
        if e in escapes:
            self.pos += 2
            return escapes[e]
        if e in _HEX_ESCAPES:
            n = _HEX_ESCAPES[e]
            digits = self.text[self.pos + 2:self.pos + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"bad escape in {where}: \\{e} needs {n} hex digits", start)
            cp = int(digits, 16)
            if cp > MAX_CODEPOINT:
                raise self.error(f"bad escape in {where}: {cp:#x} is beyond the last code point", start)
            self.pos += 2 + n
            return chr(cp)
        raise self.error(f"bad escape {self.text[start:start + 2]!r} in {where}", start, show=False)


# ---------------------------------------------------------------- printing: Grammar -> EBNF
def to_ebnf(grammar: Grammar) -> str:
    """The grammar in this dialect, root rule first: `parse_ebnf(to_ebnf(g)) == g`, and xgrammar
    reads it too (how tests hand the very same grammar to the outside reference)."""
    order = [grammar.root] + [n for n in grammar.rules if n != grammar.root]
    return "".join(f"{name} ::= {expr_to_ebnf(grammar.rules[name])}\n" for name in order)


_STRING_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_CLASS_SPECIAL = set("]\\^-[")


def _escape_char(cp: int, in_class: bool) -> str:
    if cp in _STRING_ESCAPES and (not in_class or cp != ord('"')):
        return _STRING_ESCAPES[cp]
    if in_class and chr(cp) in _CLASS_SPECIAL:
        return "\\" + chr(cp)
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if cp > 0x7E:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"
    return chr(cp)


def expr_to_ebnf(expr: Expr) -> str:
    if isinstance(expr, Bytes):
        text = expr.value.decode("utf-8")  # front ends only build UTF-8 literals
        return '"' + "".join(_escape_char(ord(c), False) for c in text) + '"'
    if isinstance(expr, CharClass):
        parts = []
        for lo, hi in expr.ranges:
            parts.append(_escape_char(lo, True) if lo == hi else f"{_escape_char(lo, True)}-{_escape_char(hi, True)}")
        return "[" + "".join(parts) + "]" if parts else '[^\\x00-\\U0010ffff]'
    if isinstance(expr, Ref):
        return expr.name
    if isinstance(expr, Seq):
        return " ".join(_atom(it) if isinstance(it, Alt) else expr_to_ebnf(it) for it in expr.items)
    if isinstance(expr, Alt):
        return " | ".join(expr_to_ebnf(it) for it in expr.items)
    if isinstance(expr, Repeat):
        suffix = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((expr.min, expr.max))
        if suffix is None:
            suffix = f"{{{expr.min},{'' if expr.max is None else expr.max}}}"
        return _atom(expr.item) + suffix
    raise TypeError(f"not a grammar expression: {expr!r}")


def _atom(expr: Expr) -> str:
    text = expr_to_ebnf(expr)
    return text if isinstance(expr, (Bytes, CharClass, Ref)) else f"({text})"
