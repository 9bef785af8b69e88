"""JSON Schema -> grammar: what a generation engine does with `response_format={"json_schema": ...}`.

A schema describes a *set of JSON values*; a grammar describes a *set of strings*. To turn one
into the other we first fix how a value is written, then spell out every value of the set in
that writing:

    format   json.dumps(value, ensure_ascii=False): ", " between items, ": " after keys, no
             other whitespace, object properties in the schema's declared order

With the spelling fixed, each JSON type becomes a small piece of grammar, and the schema's
keywords narrow those pieces down:

    {"type": "integer", "minimum": -15, "maximum": 123}
      root ::= "-" ([1-9] | "1" [0-5]) | "0" | [1-9] | [1-9] [0-9] | "1" ([0-1] [0-9] | "2" [0-3])

Objects are the interesting part. Members come out in declared order, optional ones may be
skipped, and the separator ", " appears only *between* members. So the grammar is a chain of
small rules, one per property, each meaning "the members from here on, once something has
been written" (linear in the number of properties, not one alternative per subset):

    {"type": "object", "required": ["b"], "properties":
     {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}}
      root ::= "{" ("\\"a\\": " integer root_rest1 | "\\"b\\": " string root_rest2) "}"
      root_rest1 ::= ", \\"b\\": " string root_rest2
      root_rest2 ::= ", \\"c\\": " root_c | ""
      root_c ::= "true" | "false"

(`integer`, `string`, `value`, ... are shared helper rules, the same in every grammar.)

Four more ideas cover the rest of the supported language:

* `$ref` becomes a named rule and a reference to it, so recursive schemas (a tree, a linked
  list) are fine: the grammar recurses where the schema does. A reference that would loop
  without first entering an object or array never produces a value and is rejected.
* `allOf` (and `$ref` next to other keywords) asks for *both*; grammars cannot intersect, so
  we merge the schemas keyword by keyword (types intersect, minimums take the max, ...).
  `anyOf` asks for *either*: an alternation. Together they are expanded into a flat list of
  plain alternatives (disjunctive normal form) before any grammar is built.
* `oneOf` means *exactly one* branch. When the branches can never both match (different
  types, different `const` tags) that is the same as `anyOf`; otherwise it cannot be enforced.
* `enum` / `const` are finite: each value's canonical spelling is a literal, kept only if the
  schema's other keywords accept it (checked by matching the literal against their grammar).
* Conditions become alternatives too: `if/then/else` = (if and then) or (not-if and else),
  `dependentRequired {a: [b]}` = a absent, or b present; `not S` is spelled out for S made of
  type, required, properties, const and enum (not-if the same way). Negated values become holes:
  integer and number ranges split around them, strings that never decode to them.

What cannot be enforced exactly depends on the mode (modes.py): `strict` (the
default here) raises `UnsupportedSchemaError` naming the keyword and where it is, keeping the
rule *never looser*: a grammar that accepts a value the schema rejects would let the model write
invalid output, which is the one thing structured generation promises not to do. `best-effort`
(what the server uses) relaxes it instead, to a larger language, never a smaller one, and lists
each relaxation in `grammar.warnings`. Unknown keywords are annotations in both (as the spec says).
Where we are stricter than the schema it is documented below.

Two readings of a schema (`strict`):

    strict=True   how generation engines (xgrammar's strict_mode) read it: an object schema
                  that declares `properties` or `required` allows no other properties unless
                  `additionalProperties` says so, `prefixItems` without `items` allows no more
                  items, and `format` is enforced (date, time, date-time, uuid, ipv4, ipv6,
                  email, uri, hostname).
    strict=False  what the specification says (used for the JSON-Schema-Test-Suite): absent
                  `additionalProperties` allows any extra property, `format` is an annotation.

In both, the defaults are applied after `allOf`/`anyOf`/`$ref` siblings are merged, so
`{"properties": {...}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}` means what it
says. Where both converters support a schema, strict mode accepts the same strings as
`xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)`, except
where xgrammar is looser than the schema (listed in the tests).

Where we are stricter than the schema (the grammar never writes these, though they are valid):

* An object's properties appear in declared order; extra properties come after them.
* An extra property's name may use a backslash escape only for characters that occur in no
  declared name: otherwise "\\u0061" could smuggle a wrong-typed "a" in as an extra property.
* `pattern`: characters that need escaping inside a JSON string (`"`, `\\`, control
  characters) are removed from the pattern's literals and classes, so the part of a string
  the pattern matches is always written raw. The text around an unanchored match may contain
  escapes.
* `minLength`/`maxLength` count an escape as one character, and take no \\u escapes of
  surrogates: "\\ud83d\\ude00" is one character written as two escapes (json.dumps writes it raw).
* Formats accept their canonical spelling only (uuid: 8-4-4-4-12 hex digits; ipv4: no
  leading zeros; date/time: RFC 3339 without leap seconds, years 0001-9999); email, hostname,
  ipv6 and uri follow xgrammar's grammars (email: no quoted local part; hostname: lower case).
* Numbers with bounds (or holes from `not`) are written without an exponent: 1e-05 is not.
* `not {type: integer}` leaves out the non-integral numbers too (no type names them).

Keyword table (SUPPORTED_FEATURES / UNSUPPORTED_FEATURES hold the same, for the README):

    supported                       how
    type (one or a list)            one grammar piece per type; no type = every type
    enum, const                     literals of the canonical spelling, filtered by siblings
    properties, required            the member chain above; required undeclared names too
    additionalProperties            bool or schema; extra names never decode to a declared one
    items, prefixItems              per-position pieces, ", " between them
    minItems, maxItems              repetition bounds
    uniqueItems                     false, or true when maxItems <= 1 (otherwise refused)
    minLength, maxLength            character repetition bounds
    pattern                         frontends/regex_parser.py, with search semantics (unanchored = "...*")
    minimum, maximum,               exact digit patterns: integer ranges; numbers without
    exclusiveMinimum/Maximum        an exponent (numbers.py)
    anyOf, allOf, $ref (local)      alternation, keyword merge, named rules (recursion ok)
    oneOf                           when its branches are provably disjoint
    format (strict reading)         date, time, date-time, uuid, ipv4, ipv6, email, uri
                                    (hostname: best-effort, label lengths not bounded)
    if/then/else, not               alternatives, where the condition can be negated
    dependentRequired/Schemas,      alternatives: the name absent, or what it needs
    dependencies (draft 7)
    patternProperties               when nothing else is allowed and no declared name matches
    $defs, definitions              where references point
    annotations, unknown keywords   ignored (unknown ones with a warning)

    strict mode refuses, best-effort relaxes (with a warning): propertyNames,
    min/maxProperties, uniqueItems (true), contains, multipleOf, unevaluatedItems/Properties,
    $dynamicRef, $anchor, $id below the root, remote $ref, other formats, pattern together
    with minLength/maxLength/format, overlapping oneOf, if/not on other conditions,
    patternProperties otherwise.

Where the code is: keywords.py (the errors, the keyword vocabulary and its checks),
context.py (what one compile shares: the document, the budget, the rules and their names),
flatten.py (Flattener: $ref/allOf/anyOf/oneOf flattened into alternatives), build.py (Builder:
one alternative -> grammar pieces), values.py (leaf pieces: integer ranges, strings, formats,
patterns, the shared helper rules), numbers.py (number bounds), modes.py (strict and
best-effort), defaults.py (serving-mode default bounds). This file ties them together and
cleans up the rules built. A schema from a stranger is compiled under a CompileBudget
(the stage's budget.py): its limits are checked where each keyword is read.
"""
from __future__ import annotations

import json

from ..budget import CompileBudget, recursion_guard
from ..grammar import Alt, Bytes, CharClass, Expr, Grammar, Ref, Repeat, Seq, refs_in
from .build import Builder
from .context import SchemaContext
from .defaults import DefaultBounds
from .document import check_document
from .keywords import EmptySchemaError, SchemaError
from .modes import BEST_EFFORT, STRICT, Relaxer
from .values import NEVER, alt_or_never, repeat_or_never, seq_or_never


SUPPORTED_FEATURES = {
    "type": "one grammar piece per type (a list = alternatives; no type = every type)",
    "enum, const": "literals of the canonical spelling, kept if the sibling keywords accept them",
    "properties, required": "members in declared order; optional ones may be left out",
    "additionalProperties": "bool or schema; extra names are JSON strings that never decode to a declared one",
    "items, prefixItems": "a piece per position, then repeated items",
    "minItems, maxItems": "repetition bounds",
    "uniqueItems": "false, or true with maxItems <= 1",
    "minLength, maxLength": "bounded repetition of one string character (an escape counts as one)",
    "pattern": "the regex with search semantics; unanchored sides get any characters",
    "minimum, maximum, exclusiveMinimum, exclusiveMaximum": "exact digit patterns: integer ranges, and "
                                                             "numbers written without an exponent",
    "anyOf": "alternation",
    "allOf": "keywords merged into one schema",
    "oneOf": "alternation, when no two branches can match the same value",
    "if, then, else": "(if and then) or (not-if and else), for conditions made of type, required, "
                      "properties, const, enum, not",
    "not": "the complement, for schemas made of type, required, properties, const, enum, not",
    "dependentRequired, dependentSchemas, dependencies": "alternatives: the name absent, or what it needs",
    "patternProperties": "extra keys matching the pattern, when nothing else is allowed and no declared name matches",
    "$ref": "local JSON pointers (#, #/$defs/x, #/definitions/x, #/properties/a/...): a named rule",
    "format": "strict reading: date, time, date-time, uuid, ipv4, ipv6, email, uri (hostname: best-effort)",
    "$defs, definitions": "reference targets",
    "annotations": "ignored: title, description, $comment, examples, default, deprecated, readOnly, "
                   "writeOnly, $schema, $id (root), contentMediaType, contentEncoding, contentSchema",
    "unknown keywords": "ignored as annotations (the specification's rule), each reported as a warning",
}

UNSUPPORTED_FEATURES = {  # strict mode refuses these; best-effort relaxes them (modes.py)
    "not, if": "conditions made of other keywords (best-effort: not ignored, if as (if and then) or else)",
    "patternProperties": "next to other extra properties, or matching a declared name (best-effort: "
                         "names unchecked, any pattern's schema)",
    "propertyNames": "constraints on key spellings",
    "minProperties, maxProperties": "counting members",
    "uniqueItems": "true (with maxItems > 1): no context-free grammar can compare items",
    "contains, minContains, maxContains": "counting matching items",
    "multipleOf": "divisibility",
    "unevaluatedProperties, unevaluatedItems": "depend on what other keywords evaluated",
    "$dynamicRef, $dynamicAnchor, $anchor, $id (below the root)": "dynamic and named resources",
    "$ref (remote)": "references to other documents (best-effort: any value)",
    "format": "formats other than the supported ones, and hostname's lengths (best-effort: any string)",
    "pattern with minLength/maxLength/format": "two string languages would have to intersect (best-effort: "
                                               "the format, else the pattern)",
    "oneOf": "branches that might overlap (best-effort: read as anyOf)",
}


def json_schema_to_grammar(schema: dict | bool | str, *, strict: bool = True, mode: str = STRICT,
                           budget: CompileBudget | None = None,
                           default_bounds: DefaultBounds | None = None) -> Grammar:
    """Compile a JSON Schema (a dict, a bool, or JSON text) into a Grammar whose language is
    the canonical spelling of exactly the values the schema accepts.

    `mode` (modes.py): "strict" refuses what cannot be enforced exactly;
    "best-effort" relaxes it, and `grammar.warnings` lists each relaxation (SchemaWarning).
    `strict` is a different switch: how absent keywords are read (closed objects, formats).

    `budget` (the stage's budget.py) bounds the work for a schema from a stranger: the document is
    measured first (max_depth, max_nodes, in one cheap walk), each keyword is checked where it
    is read (max_enum_values, max_properties, max_repeat, max_integer_digits, max_depth for
    $ref chains), and the deadline and cancel() are checked as it goes. Raises GrammarError
    (LimitExceeded and CompileTimeout included) or CompileCancelled, never RecursionError.

    `default_bounds` (defaults.py, best-effort mode only; ignored in strict mode):
    bounds for strings, numbers and arrays the schema leaves unbounded, each one applied
    reported in `grammar.warnings` with kind "default-bound"."""
    budget = budget or CompileBudget.unlimited()
    with recursion_guard("the schema"):
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:  # JSONDecodeError, or an integer too long to read
                raise SchemaError(f"the schema is not valid JSON: {e}") from None
        budget.check()
        check_document(budget, schema)
        ctx = SchemaContext(schema, strict, budget, Relaxer(mode),
                            default_bounds if mode == BEST_EFFORT else None)
        Builder(ctx).ref_rule("#")  # the root rule, and every rule it needs
        return _finish(ctx)


def _finish(ctx: SchemaContext) -> Grammar:
    """The rules built, cleaned up: branches that can produce nothing removed, then only the
    rules reachable from the root kept."""
    productive = _productive(ctx.rules, ctx.budget)
    if "root" not in productive:
        raise EmptySchemaError("the schema accepts no JSON value (schema false, or "
                               "contradictory keywords)")
    # A reference to a rule that produces nothing ($ref to false, ...) is the impossible:
    # drop those branches so that no empty rule is left in the grammar.
    rules = {name: _without_dead_refs(body, productive) for name, body in ctx.rules.items()
             if name in productive}
    reachable = _reachable(rules, "root", ctx.budget)
    return Grammar({name: body for name, body in rules.items() if name in reachable},
                   warnings=tuple(ctx.relaxer.warnings),
                   leaves=tuple(ctx.leaves),
                   keep=frozenset(n for n in ctx.bounded_rules.values() if n in reachable))


def _reachable(rules: dict, root: str, budget: CompileBudget) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        budget.check()
        if name not in seen:
            seen.add(name)
            todo.extend(r.name for r in refs_in(rules[name]))
    return seen


def _productive(rules: dict, budget: CompileBudget) -> set[str]:
    """Rules that can produce at least one string (fixpoint)."""
    good: set[str] = set()

    def can(e: Expr) -> bool:
        if isinstance(e, Bytes):
            return True
        if isinstance(e, CharClass):
            return bool(e.ranges)
        if isinstance(e, Ref):
            return e.name in good
        if isinstance(e, Seq):
            return all(can(it) for it in e.items)
        if isinstance(e, Alt):
            return any(can(it) for it in e.items)
        return e.min == 0 or can(e.item)

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            budget.check()
            if name not in good and can(body):
                good.add(name)
                changed = True
    return good


def _without_dead_refs(expr: Expr, productive: set, memo: dict | None = None) -> Expr:
    """expr with references to unproductive rules made impossible. A part with no such reference
    is returned as it is, and one part gives one result (memo by id): a piece used in two places
    stays one object, which the automaton builds once (nfa.py)."""
    memo = {} if memo is None else memo
    hit = memo.get(id(expr))
    if hit is not None:
        return hit[0]
    out = expr
    if isinstance(expr, Ref):
        out = expr if expr.name in productive else NEVER
    elif isinstance(expr, (Seq, Alt)):
        items = [_without_dead_refs(it, productive, memo) for it in expr.items]
        if any(a is not b for a, b in zip(items, expr.items)):
            out = seq_or_never(*items) if isinstance(expr, Seq) else alt_or_never(*items)
    elif isinstance(expr, Repeat):
        item = _without_dead_refs(expr.item, productive, memo)
        out = expr if item is expr.item else repeat_or_never(item, expr.min, expr.max)
    memo[id(expr)] = (out, expr)                   # keep expr alive: its id stays unique
    return out
