"""Flattening for the JSON Schema front end: $ref, allOf, anyOf, oneOf (and a constant `if`) are expanded
into a flat list of alternatives, each a plain conjunction of keywords (`Flat`). Two schemas
that must both hold are merged keyword by keyword; oneOf is kept only when its branches are
provably disjoint."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from urllib.parse import unquote

from .keywords import (ANNOTATIONS, BOUNDS, TYPES, VALUE_KEYWORDS, SchemaError, UnsupportedSchemaError,
                       canonical_json, check_schema, json_key, json_type, same_json)
from .modes import STRICT
from .values import NEEDS_ESCAPE, PendingRule, digit_count, matches

if TYPE_CHECKING:
    from ..grammar import Expr
    from .context import SchemaContext

MAX_ALTERNATIVES = 64  # anyOf x anyOf x ... beyond this is refused rather than built
MAX_DEPENDENCY_ALTERNATIVES = 16  # dependentRequired etc.: each doubles; past this, relaxed
# Schemas whose complement negation() can spell out (the shapes if/then/else conditions take).
NEGATABLE = {"type", "required", "properties", "const", "enum", "not"}


# ------------------------------------------------------------------ the flattened schema
@dataclass
class Flat:
    """A conjunction of plain keywords: allOf/anyOf/oneOf are gone, a $ref is kept only alone.
    Sub-schemas are stored as lists of (schema, pointer) that must all hold."""
    kw: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict)  # keyword -> pointer of the schema it came from
    ref: str | None = None                     # a bare {"$ref": pointer}: stays a rule reference

    def trivial(self) -> bool:
        return not self.kw and self.ref is None


class Flattener:
    """Flattens the schemas of one compile (`ctx`: its document, mode, budget and rules).
    `flat_expr` is the builder's Flat -> Expr, used to test an enum value against a branch
    when deciding whether two oneOf branches overlap."""

    def __init__(self, ctx: SchemaContext, flat_expr: Callable[[Flat, str], Expr]):
        self.ctx, self.flat_expr = ctx, flat_expr

    # -------------------------------------------------------------- flattening (DNF)
    def dnf(self, schema, path: str) -> list[Flat]:
        """The schema as a list of alternatives, each a plain conjunction of keywords."""
        with self.ctx.nested(path):  # counts towards max_depth, checks the deadline
            if schema is True:
                return [Flat()]
            if schema is False:
                return []
            check_schema(schema, path, self.ctx.checked, self.ctx.relaxer)
            flats = [self.own(schema, path)]
            if "$ref" in schema and self.local_ref(schema["$ref"], path):
                flats = self.conjoin(flats, [Flat(ref=self.pointer_of(schema["$ref"], path))], path)
            if "if" in schema:
                flats = self.conjoin(flats, self.condition(schema, path), path)
            for i, sub in enumerate(schema.get("allOf", ())):
                flats = self.conjoin(flats, self.dnf(sub, f"{path}/allOf/{i}"), path)
            if "anyOf" in schema:
                flats = self.conjoin(flats, [f for i, sub in enumerate(schema["anyOf"])
                                             for f in self.dnf(sub, f"{path}/anyOf/{i}")], path)
            if "not" in schema:
                flats = self.conjoin(flats, self.not_(schema["not"], f"{path}/not"), path)
            for key in ("dependentRequired", "dependentSchemas", "dependencies"):
                if key in schema:
                    flats = self.conjoin(flats, self.dependencies(schema, key, path), path)
            if "oneOf" in schema:
                flats = self.one_of(flats, schema["oneOf"], path)
            if len(flats) > MAX_ALTERNATIVES:
                raise UnsupportedSchemaError("anyOf", path, f"more than {MAX_ALTERNATIVES} combinations")
            return flats

    def one_of(self, flats: list[Flat], branches: list, path: str) -> list[Flat]:
        """Exactly one branch: the same as anyOf when no two branches can both match (within
        what the rest allows); otherwise refused, or relaxed to anyOf."""
        branches = [self.conjoin(flats, self.dnf(sub, f"{path}/oneOf/{i}"), path) for i, sub in enumerate(branches)]
        overlap = next(((j, i) for i in range(len(branches)) for j in range(i)
                        if not all(self.disjoint(a, b) for a in branches[i] for b in branches[j])), None)
        if overlap is not None:
            self.ctx.relaxer.relax("oneOf", path, f"branches {overlap[0]} and {overlap[1]} may both match a value",
                               "read as anyOf (a value may match more than one branch)")
        return [f for branch in branches for f in branch]

    def local_ref(self, ref: str, path: str) -> bool:
        """A reference into this document (compiled); others are refused or relaxed to any value."""
        if not ref.startswith("#"):
            self.ctx.relaxer.relax("$ref", path, f"remote reference {ref!r}", "any value")
            return False
        if len(ref) > 1 and not unquote(ref[1:]).startswith("/"):
            self.ctx.relaxer.relax("$anchor", path, f"reference to a named anchor {ref!r}", "any value")
            return False
        if any(w.feature == "$id" for w in self.ctx.relaxer.warnings):  # an embedded resource was ignored:
            try:                                                    # its references may point into it
                self.ctx.resolve(ref, path)
            except SchemaError:
                self.ctx.relaxer.relax("$ref", path, f"{ref!r} inside a resource with its own $id", "any value")
                return False
        return True

    # -------------------------------------------------------------- reductions to alternatives
    def condition(self, schema: dict, path: str) -> list[Flat]:
        """if/then/else = (if and then) or (not-if and else). A constant `if` picks its branch;
        an `if` without then/else does nothing. When `if` cannot be negated exactly (see
        negation), best-effort mode drops the not-if: (if and then) or else, a larger set."""
        cond = schema["if"]
        if isinstance(cond, bool):
            branch = "then" if cond else "else"
            return self.dnf(schema[branch], f"{path}/{branch}") if branch in schema else [Flat()]
        if "then" not in schema and "else" not in schema:
            return [Flat()]
        then = self.dnf(schema.get("then", True), f"{path}/then")
        other = self.dnf(schema.get("else", True), f"{path}/else")
        holds = self.conjoin(self.dnf(cond, f"{path}/if"), then, path)
        fails = self.negation(cond, f"{path}/if")
        if fails is None:
            self.ctx.relaxer.relax("if", path, "a condition that is not made of type, required, properties, "
                               "const, enum and not", "read as (if and then) or else")
            return holds + other
        return holds + self.conjoin(fails, other, path)

    def not_(self, sub, path: str) -> list[Flat]:
        fails = self.negation(sub, path)
        if fails is None:
            self.ctx.relaxer.relax("not", path, "a schema that is not made of type, required, properties, "
                               "const, enum and not", "ignored")
            return [Flat()]
        return fails

    def negation(self, schema, path: str) -> list[Flat] | None:
        """The values that fail `schema`, as alternatives; None where we cannot say exactly.
        not(A and B) = not A or not B, keyword by keyword:
            type T          the other types (not integer: also the non-integral numbers, which
                            no type names: those are left out, stricter)
            required [a]    "a" absent
            properties a: S an object whose "a" is present and fails S
            const / enum    any value but these (scalars only)
            not S           S"""
        if isinstance(schema, bool):
            return [] if schema else [Flat()]
        if not isinstance(schema, dict) or not set(schema) - ANNOTATIONS <= NEGATABLE:
            return None
        check_schema(schema, path, self.ctx.checked, self.ctx.relaxer)
        self.within_budget(schema, path)  # (an enum here becomes holes: the same limits apply)
        out = []
        if "type" in schema:
            named = _widen({schema["type"]} if isinstance(schema["type"], str) else set(schema["type"]))
            if "integer" in named:  # "number" would bring the integers back
                named.add("number")
            others = frozenset(t for t in TYPES if t not in named)
            if others:
                out.append(Flat({"type": others}, {"type": path}))
        for name in dict.fromkeys(schema.get("required", ())):
            out.append(Flat({"absent": [name]}, {"absent": path}))
        for name, sub in schema.get("properties", {}).items():
            inner = self.negation(sub, f"{path}/properties/{_escape_pointer(name)}")
            if inner is None:
                return None
            if inner:  # a property schema that can fail: the member is there and fails it
                fails = {"not": sub}
                self.ctx.made.append(fails)  # kept alive: check_schema remembers objects by id
                out.append(Flat({"type": frozenset(["object"]), "required": [name],
                                  "properties": {name: [(fails, f"{path}/properties/{_escape_pointer(name)}")]}},
                                 {"type": path, "required": path, "properties": path}))
        if "const" in schema or "enum" in schema:
            values = schema["enum"] if "enum" in schema else [schema["const"]]
            values = [v for v in values if "const" not in schema or same_json(v, schema["const"])]
            if any(isinstance(v, (list, dict)) for v in values):
                return None
            out.append(Flat({"exclude": values}, {"exclude": path}))
        if "not" in schema:
            out.extend(self.dnf(schema["not"], f"{path}/not"))
        return out

    def dependencies(self, schema: dict, key: str, path: str) -> list[Flat]:
        """dependentRequired {a: [b]}, dependentSchemas {a: S} and draft 7's dependencies (either):
        "if a is present, then ..." = a absent, or a present and .... Each dependency doubles the
        alternatives, so names the schema already requires are settled first."""
        required = set(schema.get("required", ()))
        flats = [Flat()]
        for name, need in schema[key].items():
            where = f"{path}/{key}/{_escape_pointer(name)}"
            if isinstance(need, list):
                need = [n for n in need if n not in required]
                if not need:
                    continue
                present = [Flat({"required": need}, {"required": where})]
            else:
                present = self.conjoin([Flat({"required": [name]}, {"required": where})], self.dnf(need, where), where)
            options = present if name in required else [Flat({"absent": [name]}, {"absent": where})] + present
            if len(flats) * len(options) > MAX_DEPENDENCY_ALTERNATIVES:
                self.ctx.relaxer.relax(key, where, f"more than {MAX_DEPENDENCY_ALTERNATIVES} alternatives", "ignored")
                continue
            flats = self.conjoin(flats, options, where)
        return flats

    def pointer_of(self, ref, path: str) -> str:
        self.ctx.resolve(ref, path)  # raises for remote refs, anchors and dangling pointers
        return "#" + unquote(ref[1:])

    def own(self, schema: dict, path: str) -> Flat:
        """The schema's own plain keywords, with sub-schemas as (schema, pointer) lists."""
        self.within_budget(schema, path)
        kw = {}
        for key in VALUE_KEYWORDS:
            if key not in schema or key in ("enum", "const") or (key == "format" and not self.ctx.strict):
                continue
            value = schema[key]
            if key == "type":
                value = frozenset([value] if isinstance(value, str) else value)
            elif key == "properties":
                value = {name: [(sub, f"{path}/properties/{_escape_pointer(name)}")]
                         for name, sub in value.items()}
            elif key in ("additionalProperties", "items"):
                value = [(value, f"{path}/{key}")]
            elif key == "prefixItems":
                value = [[(sub, f"{path}/prefixItems/{i}")] for i, sub in enumerate(value)]
            elif key == "required":
                value = list(dict.fromkeys(value))
            kw[key] = value
        if "patternProperties" in schema:  # (regex, the schemas a matching name's value must satisfy)
            kw["patternProperties"] = [(regex, [(sub, f"{path}/patternProperties/{_escape_pointer(regex)}")])
                                       for regex, sub in schema["patternProperties"].items()]
        if "enum" in schema or "const" in schema:  # const = a one-value enum
            values = schema["enum"] if "enum" in schema else [schema["const"]]
            kw["enum"] = [v for v in values if "const" not in schema or same_json(v, schema["const"])]
        self.widen_extras(schema, path, kw)
        return Flat(kw, {k: path for k in kw})

    def widen_extras(self, schema: dict, path: str, kw: dict) -> None:
        """Best-effort (strict mode refused it already): unevaluatedProperties is not enforced,
        but the properties it allows must stay allowed. So an extra property may take
        additionalProperties' schema or its own: a larger set than the schema's, never smaller."""
        if not isinstance(schema.get("unevaluatedProperties"), (dict, bool)):
            return
        more = [schema["unevaluatedProperties"]]
        if "additionalProperties" in schema:
            base = schema["additionalProperties"]
        elif self.ctx.strict and ("properties" in schema or "required" in schema):
            base = False  # strict reading: declared properties are all there is...
        else:
            return        # an open object allows any extra property already
        widened = {"anyOf": [base, *more]}  # ...plus what the relaxed keywords allowed
        self.ctx.made.append(widened)           # kept alive: check_schema remembers objects by id
        kw["additionalProperties"] = [(widened, path)]

    def within_budget(self, schema: dict, path: str) -> None:
        """The size limits of one schema object's keywords, checked where they are read, before
        any grammar is built from them (see the stage's budget.py)."""
        at_most = self.ctx.budget.at_most
        if "enum" in schema:
            at_most("max_enum_values", len(schema["enum"]), f"the enum at {path} has {len(schema['enum'])} values")
        for key, what in (("properties", "declares {} properties"), ("required", "requires {} properties"),
                          ("prefixItems", "lists {} prefixItems")):
            if key in schema:
                at_most("max_properties", len(schema[key]), f"the schema at {path} " + what.format(len(schema[key])))
        for key in ("minLength", "maxLength", "minItems", "maxItems"):
            # best-effort relaxes a string bound it would not write out (build.py): nothing to count
            if key in schema and (self.ctx.relaxer.mode == STRICT or key.endswith("Items")):
                at_most("max_repeat", int(schema[key]), f"{key} is {int(schema[key])} at {path}")
        for key in BOUNDS:
            if key in schema:
                digits = digit_count(schema[key])
                at_most("max_integer_digits", digits, f"{key} at {path} has {digits} digits")

    def conjoin(self, left: list[Flat], right: list[Flat], where: str = "#") -> list[Flat]:
        out = []
        for a in left:
            self.ctx.budget.check()  # anyOf x anyOf x ... multiplies
            for b in right:
                merged = self.merge(a, b)
                out.extend(merged)
            # Later keywords may still rule most combinations out, so only the final list must
            # fit MAX_ALTERNATIVES; but one this large on the way there is refused at once.
            if len(out) > MAX_ALTERNATIVES ** 2:
                raise UnsupportedSchemaError("anyOf", where, f"more than {MAX_ALTERNATIVES ** 2} "
                                             "combinations while combining allOf/anyOf/oneOf/$ref")
        return out

    def merge(self, a: Flat, b: Flat) -> list[Flat]:
        """Both must hold. Returns [] when they contradict; a $ref next to other keywords is
        inlined (once: a reference that recurses back into itself here is refused)."""
        if b.trivial():
            return [a]
        if a.trivial():
            return [b]
        if a.ref is not None:  # (a before b: properties are written in the order they are merged)
            return self.conjoin(self.expand(a), [b])
        if b.ref is not None:
            return self.conjoin([a], self.expand(b))
        kw, where = dict(a.kw), dict(a.where)
        for key, value in b.kw.items():
            if key in ("properties", "additionalProperties", "prefixItems", "items"):
                continue  # positional: merged below
            if key not in kw:
                kw[key], where[key] = value, b.where[key]
                continue
            kw[key] = _combine(key, kw[key], value, where[key])
            if kw[key] is None:
                return []
        self.merge_members(a.kw, b.kw, kw, where, b.where)
        return [Flat(kw, where)]

    @staticmethod
    def merge_members(a: dict, b: dict, kw: dict, where: dict, b_where: dict) -> None:
        """Object members and array items of two schemas that must both hold: each name (each
        position) must satisfy what *each* side says about it, as declared or as additional."""
        if any(k in side for side in (a, b) for k in ("properties", "additionalProperties")):
            names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
            if names:
                kw["properties"] = {n: _member_conj(a, n) + _member_conj(b, n) for n in names}
                where.setdefault("properties", b_where.get("properties"))
            if "additionalProperties" in a or "additionalProperties" in b:
                kw["additionalProperties"] = a.get("additionalProperties", []) + b.get("additionalProperties", [])
                where.setdefault("additionalProperties", b_where.get("additionalProperties"))
        if any(k in side for side in (a, b) for k in ("prefixItems", "items")):
            longest = max(len(a.get("prefixItems", ())), len(b.get("prefixItems", ())))
            if longest:
                kw["prefixItems"] = [_item_conj(a, j) + _item_conj(b, j) for j in range(longest)]
                where.setdefault("prefixItems", b_where.get("prefixItems"))
            if "items" in a or "items" in b:
                kw["items"] = a.get("items", []) + b.get("items", [])
                where.setdefault("items", b_where.get("items"))

    def expand(self, flat: Flat) -> list[Flat]:
        pointer = flat.ref
        if pointer in self.ctx.inlining:
            raise UnsupportedSchemaError("$ref", pointer, "a recursive reference combined with "
                                         "other keywords would have to be unrolled forever")
        self.ctx.inlining.append(pointer)
        try:
            return self.dnf(self.ctx.resolve(pointer, pointer), pointer)
        finally:
            self.ctx.inlining.pop()

    def flats_of(self, conj) -> list[Flat]:
        flats = [Flat()]
        for schema, path in conj:
            flats = self.conjoin(flats, self.dnf(schema, path), path)
        return flats

    # -------------------------------------------------------------- oneOf: can two branches overlap?
    def disjoint(self, f: Flat, g: Flat) -> bool:
        """True only when no value can satisfy both (a proof, not a guess)."""
        try:
            if f.ref is not None or g.ref is not None:
                fs = self.expand(f) if f.ref is not None else [f]
                gs = self.expand(g) if g.ref is not None else [g]
                return all(self.disjoint(x, y) for x in fs for y in gs)
        except UnsupportedSchemaError:
            return False
        tf, tg = _types_of(f), _types_of(g)
        if not _widen(tf) & _widen(tg):
            return True
        if "enum" in f.kw and "enum" in g.kw:      # two lists of values: compare them as sets
            return not {json_key(v) for v in f.kw["enum"]} & {json_key(v) for v in g.kw["enum"]}
        for a, b in ((f, g), (g, f)):
            if "enum" in a.kw and all(self.excludes(b, v) for v in a.kw["enum"]):
                return True
        if tf <= {"object"} and tg <= {"object"}:
            fp, gp = f.kw.get("properties", {}), g.kw.get("properties", {})
            for name in set(f.kw.get("required", ())) & set(g.kw.get("required", ())):
                if name in fp and name in gp and all(
                        self.disjoint(x, y) for x in self.flats_of(fp[name]) for y in self.flats_of(gp[name])):
                    return True
        if tf <= {"integer"} and tg <= {"integer"}:
            (lo1, hi1), (lo2, hi2) = int_bounds(f.kw), int_bounds(g.kw)
            if (hi1 is not None and lo2 is not None and hi1 < lo2) or \
                    (hi2 is not None and lo1 is not None and hi2 < lo1):
                return True
        return False

    def excludes(self, f: Flat, value) -> bool:
        """Provably, `value` does not satisfy f. Our grammars are exact for the canonical spelling
        of numbers, booleans, null and plain strings, but stricter than the schema for some
        objects (property order), strings with a pattern (escapes) or a format: no proof there."""
        self.ctx.budget.check()  # called once per enum value per pair of oneOf branches
        kind = json_type(value)
        types = f.kw.get("type", frozenset(TYPES))
        if kind not in types and not (kind == "integer" and "number" in types):
            return True
        if "enum" in f.kw:
            return not any(same_json(value, w) for w in f.kw["enum"])
        if kind in ("object", "array") or (kind == "string" and (
                "format" in f.kw or ("pattern" in f.kw and any(ord(c) in NEEDS_ESCAPE for c in value)))):
            return False
        try:
            return not matches(self.ctx.rules, self.flat_expr(f, "oneof_check"), canonical_json(value))
        except PendingRule:
            return False


def _member_conj(kw: dict, name: str) -> list:
    """What one schema says about the member `name`: its declared schema, else the
    additionalProperties schema, else nothing ([] = any value)."""
    declared = kw.get("properties", {})
    return declared[name] if name in declared else kw.get("additionalProperties", [])


def _item_conj(kw: dict, j: int) -> list:
    prefix = kw.get("prefixItems", ())
    return prefix[j] if j < len(prefix) else kw.get("items", [])


def _types_of(f: Flat) -> frozenset:
    types = f.kw.get("type", frozenset(TYPES))
    if "enum" in f.kw:
        types = _intersect_types(types, {json_type(v) for v in f.kw["enum"]})
    return types


def int_bounds(kw: dict) -> tuple[int | None, int | None]:
    """The smallest and largest integer the bound keywords allow (None = unbounded)."""
    lows = [math.ceil(kw["minimum"])] if "minimum" in kw else []
    lows += [math.floor(kw["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in kw else []
    highs = [math.floor(kw["maximum"])] if "maximum" in kw else []
    highs += [math.ceil(kw["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in kw else []
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _combine(key: str, x, y, where: str):
    """One keyword from two schemas that must both hold; None = they contradict."""
    if key == "type":
        return _intersect_types(x, y) or None
    if key == "enum":
        in_y = {json_key(w) for w in y}
        return [v for v in x if json_key(v) in in_y]  # [] is fine: nothing left
    if key == "patternProperties":
        return x + y
    if key in ("required", "absent", "exclude"):  # both lists hold
        return list({json_key(v): v for v in [*x, *y]}.values())
    if key in ("minItems", "minLength", "minimum", "exclusiveMinimum"):
        return max(x, y)
    if key in ("maxItems", "maxLength", "maximum", "exclusiveMaximum"):
        return min(x, y)
    if key == "uniqueItems":
        return x or y
    if x == y:  # pattern, format
        return x
    raise UnsupportedSchemaError(key, where, "two different values that must both hold")


def _escape_pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _widen(types) -> set:
    """'number' includes the integers: spell that out so sets can be intersected."""
    return set(types) | ({"integer"} if "number" in types else set())


def _intersect_types(a, b) -> frozenset:
    out = {t for t in a if t in b}
    if ("number" in a and "integer" in b) or ("integer" in a and "number" in b):
        out.add("integer")
    return frozenset(out)
