"""Grammar pieces for the JSON Schema front end: one flat alternative (a plain conjunction of keywords)
becomes an expression. Enum literals filtered by their siblings, numbers, strings, arrays, and
objects as a chain of members followed by extra members whose names avoid the declared ones."""
from __future__ import annotations

import json
import re

from ..budget import LimitExceeded
from ..frontends.regex_parser import parse_regex
from ..grammar import EMPTY, CharClass, Expr, GrammarError, Ref, Seq, chars, lit, opt, repeat, star
from .context import SchemaContext
from .defaults import DefaultBounds
from .flatten import Flat, Flattener, int_bounds
from .keywords import BOUNDS, TYPES, SchemaError, UnsupportedSchemaError, canonical_json, same_json
from .modes import STRICT
from .numbers import as_decimal, number_range
from .values import (DIGIT, FORMATS, LOOSE_FORMATS, MAX_DIGITS, NEVER, NONZERO, PLAIN, PendingRule, alt_or_never,
                     class_minus, digit_count, ends_with_anchor, has_surrogate, in_class, integer_range, json_safe,
                     matches, repeat_or_never, safe_escape, seq_or_never, top_level_alternatives)

# A length bound is one copy of a JSON string character's automaton (about 10 positions) per
# character: bounds past this many characters are not written out but relaxed (best-effort; strict
# refuses them by name), so a schema's 4,096-character field costs no more than an unbounded one.
MAX_UNROLLED_LENGTH = 256

PLAIN_ASCII = CharClass.of([(lo, min(hi, 0x7F)) for lo, hi in PLAIN.ranges if lo < 0x80])
PLAIN_NON_ASCII = CharClass.of([(max(lo, 0x80), hi) for lo, hi in PLAIN.ranges if hi >= 0x80])


class Builder:
    """Builds the grammar pieces of one compile (`ctx`: its document, mode, budget and rules);
    sub-schemas are flattened into alternatives by a Flattener first."""

    def __init__(self, ctx: SchemaContext):
        self.ctx = ctx
        self.flat = Flattener(ctx, self.flat_expr)

    def ref_rule(self, pointer: str) -> str:
        """The rule for a $ref target (built once; "#" is the root)."""
        ctx = self.ctx
        name = ctx.ref_names.get(pointer)
        if name is not None:
            if pointer in ctx.unguarded:
                raise SchemaError(f"$ref cycle through {pointer} that never enters an object or "
                                  "array: it can never produce a value")
            return name
        target = ctx.resolve(pointer, pointer)
        name = ctx.ref_names[pointer] = "root" if pointer == "#" else ctx.fresh(pointer[2:])
        ctx.rules[name] = None
        ctx.unguarded.append(pointer)
        try:
            ctx.rules[name] = self.convert([(target, pointer)], name)
        finally:
            ctx.unguarded.pop()
        return name

    def convert(self, conj, hint: str) -> Expr:
        """A list of (schema, pointer) that must all hold -> one expression."""
        with self.ctx.nested(conj[0][1] if conj else hint):  # counts towards max_depth
            if len(conj) == 1 and conj[0][0] is True:
                return self.ctx.helper("value")
            return alt_or_never(*(self.flat_expr(f, hint) for f in self.flat.flats_of(conj)))

    def flat_expr(self, f: Flat, hint: str) -> Expr:
        if f.ref is not None:
            return Ref(self.ref_rule(f.ref))
        if not f.kw:
            return self.ctx.helper("value")
        if "enum" in f.kw:
            return self.enum_expr(f, hint)
        types = f.kw.get("type", frozenset(TYPES))
        out = f.kw.get("exclude", [])  # values `not` / a failed `if` rule out
        pieces = {"null": lambda: alt_or_never(*[lit("null")] * (not _listed(None, out))),
                  "boolean": lambda: alt_or_never(*(lit(canonical_json(b)) for b in (True, False) if not _listed(b, out))),
                  "number": lambda: self.number_expr(f), "integer": lambda: self.integer_expr(f),
                  "string": lambda: self.string_expr(f, hint), "array": lambda: self.array_expr(f, hint),
                  "object": lambda: self.object_expr(f, hint)}
        if "number" in types:
            types = types - {"integer"}  # number already includes the integers
        return alt_or_never(*(pieces[t]() for t in TYPES if t in types))

    def enum_expr(self, f: Flat, hint: str) -> Expr:
        """Each value's canonical literal, if the sibling keywords accept it."""
        rest = Flat({k: v for k, v in f.kw.items() if k not in ("enum", "exclude")}, f.where)
        defaults, self.ctx.defaults = self.ctx.defaults, DefaultBounds()  # listed values need no default bound
        try:
            check = self.flat_expr(rest, hint) if rest.kw else None
        finally:
            self.ctx.defaults = defaults
        kept = []
        for value in f.kw["enum"]:
            self.ctx.budget.check()
            if _listed(value, f.kw.get("exclude", [])):
                continue
            text = canonical_json(value)
            try:
                literal = lit(text)
            except UnicodeEncodeError:  # a lone surrogate: no UTF-8 output can contain it
                raise UnsupportedSchemaError("enum", f.where["enum"], f"value {text} is not "
                                             "valid Unicode") from None
            try:
                if check is None or matches(self.ctx.rules, check, text):
                    kept.append(literal)
            except PendingRule as e:
                raise UnsupportedSchemaError("enum", f.where["enum"], "checking a value against "
                                             f"the recursive rule {e} that contains it") from None
        expr = alt_or_never(*kept)
        self.ctx.cost(expr, "enum", f.where["enum"])
        return expr

    def number_expr(self, f: Flat) -> Expr:
        """Bounds (and values ruled out) as exact digit patterns without an exponent
        (numbers.py); no bound and no hole: any JSON number."""
        holes = sorted({as_decimal(v) for v in f.kw.get("exclude", []) if _is_number(v)})
        if not holes and not any(k in f.kw for k in BOUNDS):
            return self.default_bounded("number", f) or self.ctx.helper("number")
        (lo, lo_open), (hi, hi_open) = _number_bounds(f.kw)
        holes = [h for h in holes if (lo is None or h >= lo) and (hi is None or h <= hi)]
        edges = [(lo, lo_open)] + [(h, True) for h in holes] + [(hi, hi_open)]
        return alt_or_never(*(number_range(a, a_open, b, b_open) for (a, a_open), (b, b_open) in zip(edges, edges[1:])))

    def integer_expr(self, f: Flat) -> Expr:
        lo, hi = int_bounds(f.kw)
        for bound in (lo, hi):
            if bound is not None and digit_count(bound) > MAX_DIGITS:
                key = next(k for k in BOUNDS if k in f.kw)
                raise UnsupportedSchemaError(key, f.where[key], f"an integer bound of {digit_count(bound)} "
                                             f"digits (at most {MAX_DIGITS})")
        holes = sorted({int(v) for v in f.kw.get("exclude", [])
                        if _is_number(v) and (isinstance(v, int) or v.is_integer())})
        if lo is None and hi is None and not holes:
            return self.default_bounded("integer", f) or self.ctx.helper("integer")
        holes = [h for h in holes if (lo is None or h >= lo) and (hi is None or h <= hi)]
        edges = [lo] + holes + [hi]  # the ranges between the holes
        return alt_or_never(*(integer_range(None if a is None else a + (i > 0), None if b is None else b - (i < len(holes)))
                      for i, (a, b) in enumerate(zip(edges, edges[1:]))))

    def string_expr(self, f: Flat, hint: str) -> Expr:
        fmt, pattern = f.kw.get("format"), f.kw.get("pattern")
        lo, hi = int(f.kw.get("minLength", 0)), f.kw.get("maxLength")
        hi = None if hi is None else int(hi)
        lengths = [k for k in ("minLength", "maxLength") if k in f.kw]
        relax = self.ctx.relaxer.relax
        if fmt is not None and fmt not in FORMATS:
            relax("format", f.where["format"], f"format {fmt!r} (supported: {', '.join(FORMATS)})", "any string")
            fmt = None
        if fmt is not None:
            if fmt in LOOSE_FORMATS:
                relax("format", f.where["format"], f"format {fmt!r}", f"{LOOSE_FORMATS[fmt]}")
            if pattern is not None or lengths:
                relax("format", f.where["format"], "together with " + ", ".join(["pattern"] * (pattern is not None)
                                                                              + lengths),
                      f"only the format {fmt!r} is enforced")
            expr = seq_or_never(lit('"'), self.ctx.helper("format_" + fmt.replace("-", "_")), lit('"'))
            self.ctx.cost(expr, "format", f.where["format"])
        elif pattern is not None:
            if lengths:
                relax("pattern", f.where["pattern"], "together with " + ", ".join(lengths),
                      "only the pattern is enforced")
            expr = seq_or_never(lit('"'), self.pattern_expr(pattern, f.where["pattern"]), lit('"'))
            self.ctx.cost(expr, "pattern", f.where["pattern"])
        elif lo == 0 and hi is None:
            # (not with strings ruled out by `not`: the generic string is the exact way to do that)
            bounded = None if _string_excludes(f) else self.default_bounded("string", f)
            expr = bounded or self.ctx.helper("string")
        elif hi is not None and lo > hi:
            expr = NEVER
        else:
            lo, hi = self.unrollable_lengths(f, lo, hi)
            if hi is None and self.ctx.defaults.max_string_length is not None and not _string_excludes(f):
                hi = max(lo, self.ctx.defaults.max_string_length)
                self.note_default(f, "maxLength", f"no maxLength: at most {hi} characters (serving default)")
            expr = seq_or_never(lit('"'), repeat(self.ctx.helper("one_char"), lo, hi), lit('"'))
            self.ctx.cost(expr, "maxLength" if hi is not None else "minLength", f.where.get("maxLength", f.where.get("minLength", "#")))
        return self.without_strings(expr, f, hint)

    def unrollable_lengths(self, f: Flat, lo: int, hi: int | None) -> tuple[int, int | None]:
        """minLength and maxLength as this compiler writes them out: one past MAX_UNROLLED_LENGTH
        is relaxed (minLength to 0, maxLength to none), or refused in strict mode."""
        if lo > MAX_UNROLLED_LENGTH:
            self.ctx.relaxer.relax("minLength", f.where["minLength"], f"minLength {lo} is over the "
                                   f"{MAX_UNROLLED_LENGTH} characters a bound may count here", "not enforced")
            lo = 0
        if hi is not None and hi > MAX_UNROLLED_LENGTH:
            self.ctx.relaxer.relax("maxLength", f.where["maxLength"], f"maxLength {hi} is over the "
                                   f"{MAX_UNROLLED_LENGTH} characters a bound may count here", "not enforced")
            hi = None
        return lo, hi

    # -------------------------------------------------------------- serving-mode default bounds
    def default_bounded(self, kind: str, f: Flat) -> Expr | None:
        """The default-bounded version of an unbounded string, number or integer (one shared rule
        per kind and bound, reported once per schema object), or None without such a default."""
        d = self.ctx.defaults
        bound = d.max_string_length if kind == "string" else d.max_number_digits
        if bound is None:
            return None
        if kind == "string":
            self.note_default(f, "maxLength", f"no maxLength: at most {bound} characters (serving default)")
        else:
            self.note_default(f, "maxDigits", f"no bounds: at most {bound} digits in the integer part, "
                                              f"the fraction and the exponent (serving default)")
        name = self.ctx.bounded_rules.get((kind, bound))
        if name is None:
            name = self.ctx.bounded_rules[(kind, bound)] = self.ctx.fresh(f"{kind}_max{bound}")
            if kind == "string":
                body = seq_or_never(lit('"'), repeat(self.ctx.helper("char"), 0, bound), lit('"'))
            else:
                digits = repeat(DIGIT, 0, bound - 1)
                if kind == "integer":
                    body = alt_or_never(lit("0"), seq_or_never(opt(lit("-")), NONZERO, digits))
                else:
                    body = seq_or_never(opt(lit("-")), alt_or_never(lit("0"), seq_or_never(NONZERO, digits)),
                                opt(seq_or_never(lit("."), repeat(DIGIT, 1, bound))),
                                opt(seq_or_never(chars("eE"), opt(chars("+-")), repeat(DIGIT, 1, min(bound, 3)))))
            self.ctx.rules[name] = body
        return Ref(name)

    def note_default(self, f: Flat, keyword: str, text: str) -> None:
        pointer = next(iter(f.where.values()), "#")  # the schema object the keywords came from
        self.ctx.relaxer.note(keyword, pointer, text, kind="default-bound")

    def without_strings(self, expr: Expr, f: Flat, hint: str) -> Expr:
        """The string piece minus the strings `not` rules out. Any string: a string that does not
        decode to one of them (the same construction as extra property names). With other string
        keywords the two would have to intersect: exact only if the piece rejects them anyway."""
        names = [v for v in f.kw.get("exclude", []) if isinstance(v, str)]
        if not names or expr == NEVER:
            return expr
        if expr == self.ctx.helper("string"):
            return self.key_not_in(names, hint)
        try:
            if not any(matches(self.ctx.rules, expr, canonical_json(n)) for n in names):
                return expr
        except PendingRule:
            pass
        self.ctx.relaxer.relax("not", f.where["exclude"], "ruling out strings together with pattern, format "
                           "or length bounds", "those strings are allowed")
        return expr

    def pattern_expr(self, pattern: str, where: str) -> Expr:
        """JSON Schema patterns *search*: each top-level alternative that is not anchored with
        ^ (or $) may have any characters before (or after) its match."""
        anything = star(self.ctx.helper("char"))
        options = []
        for branch in top_level_alternatives(pattern):
            try:
                body = json_safe(parse_regex(branch, budget=self.ctx.budget))
            except LimitExceeded:
                raise                                  # a limit of this server, not of the schema
            except GrammarError as e:
                self.ctx.relaxer.relax("pattern", where, str(e), "any string")
                return star(self.ctx.helper("char"))
            starts, ends = branch.startswith("^"), ends_with_anchor(branch)
            options.append(seq_or_never(EMPTY if starts else anything, body, EMPTY if ends else anything))
        return alt_or_never(*options)

    def array_expr(self, f: Flat, hint: str) -> Expr:
        lo, hi = int(f.kw.get("minItems", 0)), f.kw.get("maxItems")
        hi = None if hi is None else int(hi)
        if f.kw.get("uniqueItems") and (hi is None or hi > 1):
            self.ctx.relaxer.relax("uniqueItems", f.where["uniqueItems"], "no grammar can compare items",
                               "items may repeat")
        if hi is not None and lo > hi:
            return NEVER
        prefix = f.kw.get("prefixItems", [])
        if hi is None and self.ctx.defaults.max_array_items is not None:
            hi = max(lo, len(prefix), self.ctx.defaults.max_array_items)
            self.note_default(f, "maxItems", f"no maxItems: at most {hi} items (serving default)")
        items = f.kw.get("items")
        if items is None:  # strict: prefixItems alone lists every item
            items = [(False, hint)] if self.ctx.strict and "prefixItems" in f.kw else []
        if not prefix and not items and lo == 0 and hi is None:
            return self.ctx.helper("array")
        with self.ctx.guarded():
            heads = [self.convert(c, f"{hint}_{j}") for j, c in enumerate(prefix[:hi])]
            item = self.convert(items, f"{hint}_item") if items else self.ctx.helper("value")

        # The items from position j on, with j items already written: built back to front, from
        # the repeated items after the prefix down to position 0. Past the first few positions
        # each piece is a rule of its own, so a long prefixItems does not nest ever deeper.
        j = len(heads)
        need, room = max(lo - j, 0), None if hi is None else hi - j
        if j or room == 0:
            rest = repeat_or_never(seq_or_never(lit(", ") if j else EMPTY, item), need, room)
        else:
            shared = self.ctx.named(f"{hint}_item", item) if item != NEVER else NEVER
            first = seq_or_never(shared, repeat_or_never(seq_or_never(lit(", "), shared), max(need - 1, 0),
                                         None if room is None else room - 1))
            rest = first if need else repeat_or_never(first, 0, 1)
        for j in reversed(range(len(heads))):
            if j % 8 == 7:
                rest = self.ctx.named(f"{hint}_from{j + 1}", rest)
            this = seq_or_never(lit(", ") if j else EMPTY, heads[j], rest)
            rest = alt_or_never(EMPTY, this) if j >= lo else this
        return seq_or_never(lit("["), rest, lit("]"))

    def object_expr(self, f: Flat, hint: str) -> Expr:
        props, required = f.kw.get("properties", {}), f.kw.get("required", [])
        extra = f.kw.get("additionalProperties")
        absent = f.kw.get("absent", [])  # names that must not appear (dependencies, a failed if)
        patterns = f.kw.get("patternProperties", [])
        declares = "properties" in f.kw or "required" in f.kw or bool(patterns)
        if extra is None:  # strict: the declared properties are all there is
            extra = [(False, hint)] if self.ctx.strict and declares else []
        if any(name in absent for name in required):
            return NEVER
        if not declares and not extra and not absent:
            return self.ctx.helper("object")
        undeclared = [n for n in required if n not in props]
        if undeclared and self.ctx.strict and f.kw.get("additionalProperties") is None:
            if self.ctx.relaxer.mode == STRICT:
                raise SchemaError(f"required property {undeclared[0]!r} at {f.where['required']} is not "
                                  "in 'properties', and strict mode allows no other properties "
                                  "(declare it, or set additionalProperties)")
            # Best-effort: the schema means the property exists (drone-ci's volumes name it in
            # a oneOf branch, its schema nowhere); the strict reading would make the object
            # impossible. Allow it, with any value.
            self.ctx.relaxer.relax("required", f.where["required"],
                               f"required {', '.join(map(repr, undeclared))} not declared in 'properties' "
                               "(the strict reading allows no other properties)", "allowed with any value")
            props, undeclared = {**props, **{n: [] for n in undeclared}}, []
        names = [n for n in list(props) + undeclared if n not in absent]
        if any(has_surrogate(n) for n in names + absent):
            raise UnsupportedSchemaError("properties", f.where.get("properties", f.where.get("required")),
                                         "a property name that is not valid Unicode (a lone surrogate)")
        with self.ctx.guarded():
            values = {n: self.convert(props.get(n, extra), f"{hint}_{n}") for n in names}
            pattern_member, extra = self.pattern_members(patterns, names + absent, extra, f, hint)
            closed = extra and all(s is False for s, _ in extra)
            extra_value = NEVER if closed else self.convert(extra, f"{hint}_extra")
        extra_member = alt_or_never(pattern_member, NEVER if extra_value == NEVER else
                            seq_or_never(self.key_not_in(names + absent, hint), lit(": "), extra_value))
        members = [(n, values[n], n in required) for n in names]
        return seq_or_never(lit("{"), self.member_chain(members, extra_member, hint), lit("}"))

    def pattern_members(self, patterns, names, extra, f: Flat, hint: str):
        """patternProperties: (an extra member whose key a pattern matches, what additionalProperties
        becomes). Exact when nothing else is allowed (additionalProperties false, or strict
        reading), all patterns share one schema and no declared name matches a pattern: then an
        extra member is a key the pattern *searches* into (pattern_expr) and a value of that schema.
        Otherwise best-effort: names are not checked, an extra member may take additionalProperties'
        schema or any pattern's (a larger set, never a smaller one)."""
        if not patterns:
            return NEVER, extra
        where = f.where["patternProperties"]
        closed = bool(extra) and all(s is False for s, _ in extra)
        why = None if closed else "together with other extra properties (names matching no pattern)"
        if why is None and len({json.dumps([repr(s) for s, _ in conj]) for _, conj in patterns}) > 1:
            why = "patterns with different schemas (a name may match several)"
        for regex, _ in patterns if why is None else ():
            try:
                hit = next((n for n in names if re.search(regex, n)), None)
                for branch in top_level_alternatives(regex):
                    parse_regex(branch)
            except (re.error, GrammarError) as e:
                why = f"pattern {regex!r}: {e}"
                break
            if hit is not None:
                why = f"the declared name {hit!r} matches the pattern {regex!r}"
                break
        if why is None:
            value = self.convert(patterns[0][1], f"{hint}_pattern")
            keys = alt_or_never(*(self.pattern_expr(regex, where) for regex, _ in patterns))
            return seq_or_never(lit('"'), keys, lit('"'), lit(": "), value), extra
        self.ctx.relaxer.relax("patternProperties", where, why, "names are not checked against the patterns: an extra "
                           "property may take additionalProperties' schema or any pattern's")
        if not extra:
            return NEVER, extra  # any extra property is allowed already
        widened = {"anyOf": [{"allOf": [s for s, _ in extra]}, *(s for _, conj in patterns for s, _ in conj)]}
        self.ctx.made.append(widened)  # kept alive: check_schema remembers objects by id
        return NEVER, [(widened, where)]

    def member_chain(self, members, extra_member: Expr, hint: str) -> Expr:
        """Declared members in order (optional ones may be skipped), then any extra members.
        `after` = the rest once something was written (each piece starts with ", "), `first` =
        the rest when nothing was written yet; both are built back to front."""
        after = repeat_or_never(seq_or_never(lit(", "), extra_member), 0, None)
        first = repeat_or_never(seq_or_never(extra_member, after), 0, 1)
        for i in reversed(range(len(members))):
            name, value, required = members[i]
            after = self.ctx.named(f"{hint}_rest{i + 1}", after)  # used up to three times below
            member = seq_or_never(lit(json.dumps(name, ensure_ascii=False)), lit(": "),
                          self.ctx.named(f"{hint}_{name}", value))
            # One object for "this member and the rest", with or without ", " before it: the
            # automaton builds it once (nfa.py), not once per way of reaching it.
            take_first = seq_or_never(member, after)
            take_after = Seq((lit(", "), take_first)) if take_first != NEVER else NEVER
            if required:
                after, first = take_after, take_first
            else:
                after, first = alt_or_never(take_after, after), alt_or_never(take_first, first)
        return first

    def key_not_in(self, names, hint: str) -> Expr:
        """A JSON string that does not *decode* to a declared name. Extra keys may use only escapes
        for characters that occur in no declared name, so a key with an escape can never equal
        one; a key without escapes is its own spelling, and a trie of the (escape-free) names
        rules those out: stopping early, or leaving the trie at any point, gives another key."""
        if not names:
            return self.ctx.helper("string")
        used = {ord(c) for name in names for c in name}
        escape = self.ctx.named(f"{hint}_escape", safe_escape(used))
        key_char = self.ctx.named(f"{hint}_keychar", alt_or_never(PLAIN, seq_or_never(lit("\\"), escape)))
        trie: dict = {}
        for name in names:
            if all(in_class(PLAIN, c) for c in name):  # others need escapes: unreachable anyway
                node = trie
                for c in name:
                    node = node.setdefault(c, {})
                node[None] = True  # a declared name ends here
        return self.ctx.named(f"{hint}_key", seq_or_never(lit('"'), self.trie_expr(trie, key_char, escape, hint), lit('"')))

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
        # Leaving the trie ends the same way at every node: one object for it (built once,
        # nfa.py), and one for leaving by a non-ASCII character or an escape, which no node's
        # ASCII letters change; only the ASCII part of "any other character" is per node.
        tail = star(key_char)
        other = alt_or_never(PLAIN_NON_ASCII, seq_or_never(lit("\\"), escape))
        leave_other = seq_or_never(other, tail)
        built: dict[int, Expr] = {}
        for node, depth in reversed(order):         # each child before its parent
            inside = sorted(c for c in node if c is not None)
            options = [] if None in node else [EMPTY]
            options += [seq_or_never(lit(c), built.pop(id(node[c]))) for c in inside]
            if all(ord(c) < 0x80 for c in inside):
                options += [seq_or_never(class_minus(PLAIN_ASCII, [ord(c) for c in inside]), tail), leave_other]
            else:
                leave = alt_or_never(class_minus(PLAIN, [ord(c) for c in inside]), seq_or_never(lit("\\"), escape))
                options.append(seq_or_never(leave, tail))
            expr = alt_or_never(*options)
            built[id(node)] = self.ctx.named(f"{hint}_key{depth}", expr) if depth % 16 == 15 else expr
        return built[id(trie)]


def _listed(value, values) -> bool:
    return any(same_json(value, v) for v in values)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _string_excludes(f: Flat) -> bool:
    return any(isinstance(v, str) for v in f.kw.get("exclude", []))


def _number_bounds(kw: dict):
    """(lo, lo is open), (hi, hi is open) from the four bound keywords, the tighter of each pair."""
    lows = [(as_decimal(kw["minimum"]), False)] if "minimum" in kw else []
    lows += [(as_decimal(kw["exclusiveMinimum"]), True)] if "exclusiveMinimum" in kw else []
    highs = [(as_decimal(kw["maximum"]), False)] if "maximum" in kw else []
    highs += [(as_decimal(kw["exclusiveMaximum"]), True)] if "exclusiveMaximum" in kw else []
    lo = max(lows, key=lambda b: (b[0], b[1]), default=(None, False))
    hi = min(highs, key=lambda b: (b[0], not b[1]), default=(None, False))
    return lo, hi
