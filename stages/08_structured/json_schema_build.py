"""Grammar pieces for json_schema.py: one flat alternative (a plain conjunction of keywords)
becomes an expression. Enum literals filtered by their siblings, numbers, strings, arrays, and
objects as a chain of members followed by extra members whose names avoid the declared ones."""
from __future__ import annotations

import json

from .budget import LimitExceeded
from .grammar import EMPTY, Expr, GrammarError, Ref, alt, lit, repeat, star
from .json_schema_keywords import BOUNDS, TYPES, SchemaError, UnsupportedSchemaError, canonical_json
from .json_schema_merge import _Flat, _int_bounds
from .json_schema_values import (FORMATS, MAX_DIGITS, NEVER, PLAIN, _alt, _class_minus, _ends_with_anchor,
                                 _has_surrogate, _in_class, _json_safe, _PendingRule, _repeat, _safe_escape, _seq,
                                 _top_level_alternatives, digit_count, integer_range, matches)
from .regex_parser import parse_regex


class _Builder:
    """The building half of json_schema._Converter (a mixin). It uses the converter's `strict`,
    `rules`, `budget`, `helper`, `named`, `ref_rule`, `guarded`, `nested` and `flats_of`."""

    def convert(self, conj, hint: str) -> Expr:
        """A list of (schema, pointer) that must all hold -> one expression."""
        with self.nested(conj[0][1] if conj else hint):  # counts towards max_depth
            if len(conj) == 1 and conj[0][0] is True:
                return self.helper("value")
            return _alt(*(self.flat_expr(f, hint) for f in self.flats_of(conj)))

    def flat_expr(self, f: _Flat, hint: str) -> Expr:
        if f.ref is not None:
            return Ref(self.ref_rule(f.ref))
        if not f.kw:
            return self.helper("value")
        if "enum" in f.kw:
            return self.enum_expr(f, hint)
        types = f.kw.get("type", frozenset(TYPES))
        pieces = {"null": lambda: lit("null"), "boolean": lambda: alt(lit("true"), lit("false")),
                  "number": lambda: self.number_expr(f), "integer": lambda: self.integer_expr(f),
                  "string": lambda: self.string_expr(f, hint), "array": lambda: self.array_expr(f, hint),
                  "object": lambda: self.object_expr(f, hint)}
        if "number" in types:
            types = types - {"integer"}  # number already includes the integers
        return _alt(*(pieces[t]() for t in TYPES if t in types))

    def enum_expr(self, f: _Flat, hint: str) -> Expr:
        """Each value's canonical literal, if the sibling keywords accept it."""
        rest = _Flat({k: v for k, v in f.kw.items() if k != "enum"}, f.where)
        check = self.flat_expr(rest, hint) if rest.kw else None
        kept = []
        for value in f.kw["enum"]:
            self.budget.check()
            text = canonical_json(value)
            try:
                literal = lit(text)
            except UnicodeEncodeError:  # a lone surrogate: no UTF-8 output can contain it
                raise UnsupportedSchemaError("enum", f.where["enum"], f"value {text} is not "
                                             "valid Unicode") from None
            try:
                if check is None or matches(self.rules, check, text):
                    kept.append(literal)
            except _PendingRule as e:
                raise UnsupportedSchemaError("enum", f.where["enum"], "checking a value against "
                                             f"the recursive rule {e} that contains it") from None
        return _alt(*kept)

    def number_expr(self, f: _Flat) -> Expr:
        for key in BOUNDS:
            if key in f.kw:
                raise UnsupportedSchemaError(key, f.where[key], "bounds on non-integer numbers "
                                             "(use type integer, or leave the bound out)")
        return self.helper("number")

    def integer_expr(self, f: _Flat) -> Expr:
        lo, hi = _int_bounds(f.kw)
        for bound in (lo, hi):
            if bound is not None and digit_count(bound) > MAX_DIGITS:
                key = next(k for k in BOUNDS if k in f.kw)
                raise UnsupportedSchemaError(key, f.where[key], f"an integer bound of {digit_count(bound)} "
                                             f"digits (at most {MAX_DIGITS})")
        return self.helper("integer") if lo is None and hi is None else integer_range(lo, hi)

    def string_expr(self, f: _Flat, hint: str) -> Expr:
        fmt, pattern = f.kw.get("format"), f.kw.get("pattern")
        lo, hi = int(f.kw.get("minLength", 0)), f.kw.get("maxLength")
        hi = None if hi is None else int(hi)
        lengths = [k for k in ("minLength", "maxLength") if k in f.kw]
        if fmt is not None:
            if fmt not in FORMATS:
                raise UnsupportedSchemaError("format", f.where["format"], f"format {fmt!r} "
                                             f"(supported: {', '.join(FORMATS)})")
            if pattern is not None or lengths:
                raise UnsupportedSchemaError("format", f.where["format"], "together with "
                                             + ", ".join(["pattern"] * (pattern is not None) + lengths))
            return _seq(lit('"'), self.helper("format_" + fmt.replace("-", "_")), lit('"'))
        if pattern is not None:
            if lengths:
                raise UnsupportedSchemaError("pattern", f.where["pattern"], "together with "
                                             + ", ".join(lengths))
            return _seq(lit('"'), self.pattern_expr(pattern, f.where["pattern"]), lit('"'))
        if lo == 0 and hi is None:
            return self.helper("string")
        if hi is not None and lo > hi:
            return NEVER
        return _seq(lit('"'), repeat(self.helper("one_char"), lo, hi), lit('"'))

    def pattern_expr(self, pattern: str, where: str) -> Expr:
        """JSON Schema patterns *search*: each top-level alternative that is not anchored with
        ^ (or $) may have any characters before (or after) its match."""
        anything = star(self.helper("char"))
        options = []
        for branch in _top_level_alternatives(pattern):
            try:
                body = _json_safe(parse_regex(branch, budget=self.budget))
            except LimitExceeded:
                raise                                  # a limit of this server, not of the schema
            except GrammarError as e:
                raise UnsupportedSchemaError("pattern", where, str(e)) from None
            starts, ends = branch.startswith("^"), _ends_with_anchor(branch)
            options.append(_seq(EMPTY if starts else anything, body, EMPTY if ends else anything))
        return _alt(*options)

    def array_expr(self, f: _Flat, hint: str) -> Expr:
        lo, hi = int(f.kw.get("minItems", 0)), f.kw.get("maxItems")
        hi = None if hi is None else int(hi)
        if f.kw.get("uniqueItems") and (hi is None or hi > 1):
            raise UnsupportedSchemaError("uniqueItems", f.where["uniqueItems"])
        if hi is not None and lo > hi:
            return NEVER
        prefix = f.kw.get("prefixItems", [])
        items = f.kw.get("items")
        if items is None:  # strict: prefixItems alone lists every item
            items = [(False, hint)] if self.strict and "prefixItems" in f.kw else []
        if not prefix and not items and lo == 0 and hi is None:
            return self.helper("array")
        with self.guarded():
            heads = [self.convert(c, f"{hint}_{j}") for j, c in enumerate(prefix[:hi])]
            item = self.convert(items, f"{hint}_item") if items else self.helper("value")

        # The items from position j on, with j items already written: built back to front, from
        # the repeated items after the prefix down to position 0. Past the first few positions
        # each piece is a rule of its own, so a long prefixItems does not nest ever deeper.
        j = len(heads)
        need, room = max(lo - j, 0), None if hi is None else hi - j
        if j or room == 0:
            rest = _repeat(_seq(lit(", ") if j else EMPTY, item), need, room)
        else:
            shared = self.named(f"{hint}_item", item) if item != NEVER else NEVER
            first = _seq(shared, _repeat(_seq(lit(", "), shared), max(need - 1, 0),
                                         None if room is None else room - 1))
            rest = first if need else _repeat(first, 0, 1)
        for j in reversed(range(len(heads))):
            if j % 8 == 7:
                rest = self.named(f"{hint}_from{j + 1}", rest)
            this = _seq(lit(", ") if j else EMPTY, heads[j], rest)
            rest = _alt(EMPTY, this) if j >= lo else this
        return _seq(lit("["), rest, lit("]"))

    def object_expr(self, f: _Flat, hint: str) -> Expr:
        props, required = f.kw.get("properties", {}), f.kw.get("required", [])
        extra = f.kw.get("additionalProperties")
        declares = "properties" in f.kw or "required" in f.kw
        if extra is None:  # strict: the declared properties are all there is
            extra = [(False, hint)] if self.strict and declares else []
        if not declares and not extra:
            return self.helper("object")
        closed = extra and all(s is False for s, _ in extra)
        undeclared = [n for n in required if n not in props]
        if undeclared and self.strict and f.kw.get("additionalProperties") is None:
            raise SchemaError(f"required property {undeclared[0]!r} at {f.where['required']} is not "
                              "in 'properties', and strict mode allows no other properties "
                              "(declare it, or set additionalProperties)")
        names = list(props) + undeclared
        if any(_has_surrogate(n) for n in names):
            raise UnsupportedSchemaError("properties", f.where.get("properties", f.where.get("required")),
                                         "a property name that is not valid Unicode (a lone surrogate)")
        with self.guarded():
            values = {n: self.convert(props.get(n, extra), f"{hint}_{n}") for n in names}
            extra_value = NEVER if closed else self.convert(extra, f"{hint}_extra")
        extra_member = NEVER if extra_value == NEVER else \
            _seq(self.key_not_in(names, hint), lit(": "), extra_value)
        members = [(n, values[n], n in required) for n in names]
        return _seq(lit("{"), self.member_chain(members, extra_member, hint), lit("}"))

    def member_chain(self, members, extra_member: Expr, hint: str) -> Expr:
        """Declared members in order (optional ones may be skipped), then any extra members.
        `after` = the rest once something was written (each piece starts with ", "), `first` =
        the rest when nothing was written yet; both are built back to front."""
        after = _repeat(_seq(lit(", "), extra_member), 0, None)
        first = _repeat(_seq(extra_member, after), 0, 1)
        for i in reversed(range(len(members))):
            name, value, required = members[i]
            after = self.named(f"{hint}_rest{i + 1}", after)  # used up to three times below
            member = _seq(lit(json.dumps(name, ensure_ascii=False)), lit(": "),
                          self.named(f"{hint}_{name}", value))
            take_after, take_first = _seq(lit(", "), member, after), _seq(member, after)
            if required:
                after, first = take_after, take_first
            else:
                after, first = _alt(take_after, after), _alt(take_first, first)
        return first

    def key_not_in(self, names, hint: str) -> Expr:
        """A JSON string that does not *decode* to a declared name. Extra keys may use only escapes
        for characters that occur in no declared name, so a key with an escape can never equal
        one; a key without escapes is its own spelling, and a trie of the (escape-free) names
        rules those out: stopping early, or leaving the trie at any point, gives another key."""
        if not names:
            return self.helper("string")
        used = {ord(c) for name in names for c in name}
        escape = self.named(f"{hint}_escape", _safe_escape(used))
        key_char = self.named(f"{hint}_keychar", _alt(PLAIN, _seq(lit("\\"), escape)))
        trie: dict = {}
        for name in names:
            if all(_in_class(PLAIN, c) for c in name):  # others need escapes: unreachable anyway
                node = trie
                for c in name:
                    node = node.setdefault(c, {})
                node[None] = True  # a declared name ends here
        return self.named(f"{hint}_key", _seq(lit('"'), self.trie_expr(trie, key_char, escape, hint), lit('"')))

    def trie_expr(self, trie: dict, key_char: Expr, escape: Expr, hint: str) -> Expr:
        """The rest of a key from a trie node on: stop (unless a declared name ends there), write
        the node's next letter, or leave the trie and write any key characters. Built children
        first with a loop (a name may be thousands of letters long), and every 16 letters a rule
        of its own, so that the expression does not nest as deep as the longest name."""
        order, todo = [], [(trie, 0)]
        while todo:                                 # every node, each parent before its children
            node, depth = todo.pop()
            order.append((node, depth))
            todo.extend((node[c], depth + 1) for c in node if c is not None)
        built: dict[int, Expr] = {}
        for node, depth in reversed(order):         # each child before its parent
            inside = sorted(c for c in node if c is not None)
            options = [] if None in node else [EMPTY]
            options += [_seq(lit(c), built.pop(id(node[c]))) for c in inside]
            leave = _alt(_class_minus(PLAIN, [ord(c) for c in inside]), _seq(lit("\\"), escape))
            options.append(_seq(leave, star(key_char)))
            expr = _alt(*options)
            built[id(node)] = self.named(f"{hint}_key{depth}", expr) if depth % 16 == 15 else expr
        return built[id(trie)]
