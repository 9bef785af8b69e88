"""What one schema compile shares between its parts: the document, the mode, the budget, the
rules built so far and their names, and where the compile is (how deep, which $ref rules are
open). flatten.py and build.py read and extend it; convert.py makes one per schema."""
from __future__ import annotations

import re
from contextlib import contextmanager
from urllib.parse import unquote

from ..budget import CompileBudget
from ..grammar import EMPTY, Bytes, CharClass, Expr, Ref
from .defaults import DefaultBounds
from .keywords import SchemaError, UnsupportedSchemaError, resolve_pointer
from .modes import Relaxer
from .values import HELPERS


class SchemaContext:
    def __init__(self, document, strict: bool, budget: CompileBudget, relaxer: Relaxer,
                 defaults: DefaultBounds | None = None):
        self.doc, self.strict, self.budget, self.relaxer = document, strict, budget, relaxer
        self.defaults = defaults or DefaultBounds()  # serving-mode bounds (best-effort only); none
        self.made: list = []                      # schemas built here (keeps their ids unique)
        self.depth = 0                            # sub-schemas being compiled, one inside another
        self.rules: dict[str, Expr | None] = {}   # None while a $ref rule is being built
        self.ref_names: dict[str, str] = {}       # pointer -> rule name
        self.unguarded: list[str] = []            # $ref rules entered since the last { or [
        self.inlining: list[str] = []             # $ref targets being merged with siblings
        self.checked: set[int] = set()            # ids of schema objects already checked
        self.bounded_rules: dict[tuple, str] = {} # (kind, bound) -> rule name of a default-bounded piece
        self.leaves: list[tuple] = []             # (expr, "KEYWORD at POINTER"): each leaf constraint

    def cost(self, expr, keyword: str, pointer: str) -> None:
        """Note a leaf constraint, so that a compile too big or too slow can name the keyword that
        made it so (Grammar.largest_part; sized only then)."""
        self.leaves.append((expr, f"{keyword} at {pointer}"))

    def fresh(self, base: str) -> str:
        """A new rule name from a hint (a pointer, a property name), reserved until its body is set."""
        name, n = _sanitize(base), 1
        while name in self.rules or name in HELPERS:
            n += 1
            name = f"{_sanitize(base)}_{n}"
        self.rules[name] = None
        return name

    def named(self, hint: str, expr: Expr) -> Expr:
        """Give a piece that is used more than once its own rule (small pieces stay inline)."""
        if isinstance(expr, (Bytes, CharClass, Ref)) or expr == EMPTY:
            return expr
        name = self.fresh(hint)
        self.rules[name] = expr
        return Ref(name)

    def helper(self, name: str) -> Ref:
        """The shared pieces: value, object, array, string, char, number, integer, formats."""
        if name not in self.rules:
            self.rules[name] = None
            self.rules[name] = HELPERS[name](self)
        return Ref(name)

    @contextmanager
    def nested(self, where: str):
        """One level deeper: a sub-schema, a combinator's branch or a $ref target is being
        compiled inside another. The document's own depth was checked up front; this also
        counts $ref targets, so a chain of references cannot nest without limit either."""
        self.depth += 1
        try:
            self.budget.at_most("max_depth", self.depth, f"the schema nests {self.depth} levels deep at "
                                f"{where} (sub-schemas, allOf/anyOf/oneOf and $ref targets, one inside another)")
            self.budget.check()
            yield
        finally:
            self.depth -= 1

    @contextmanager
    def guarded(self):
        """Inside an object or array a $ref may recurse: the output has grown by then."""
        saved, self.unguarded = self.unguarded, []
        try:
            yield
        finally:
            self.unguarded = saved

    def resolve(self, ref: str, where: str):
        """The schema a local $ref points to."""
        if not ref.startswith("#"):
            raise UnsupportedSchemaError("$ref", where, f"remote reference {ref!r}")
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            raise UnsupportedSchemaError("$anchor", where, f"reference to a named anchor {ref!r}")
        try:
            return resolve_pointer(self.doc, fragment)
        except KeyError:
            raise SchemaError(f"$ref {ref!r} at {where} points to nothing") from None


def _sanitize(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:48] or "rule"
    return name if not name[0].isdigit() else "r" + name
