"""The JSON Schema front end: the grammar accepts a value's canonical spelling exactly when the schema does.

The oracle is `jsonschema` (Draft 2020-12, formats checked in strict mode). For each schema in
SCHEMAS, a seeded generator makes values *near* it (right shapes with wrong details, wrong
types, missing and extra properties, values around every bound), we write them canonically
and compare `accepts` with `is_valid`; hand-written tables pin down the edges. Strict
mode reads a schema as generation engines do (no undeclared properties), so its oracle is
jsonschema on the schema with those defaults written out (`spec_equivalent`).

Then: integer ranges against Python comparisons, the documented places where we are stricter,
the error table, grammar size, and agreement with xgrammar where both compile a schema
exactly. Known differences from xgrammar (it is looser or spells differently; we keep the
schema's meaning):

  * strings with minLength/maxLength: xgrammar drops escapes and allows raw control characters
  * pattern: xgrammar matches the whole string; JSON Schema searches (`"a"` matches "xay")
  * enum/const arrays and objects: xgrammar writes them compactly, [1,2]
  * date/time: xgrammar allows 2023-02-31, year 0000, second 60, not lowercase t/z; ipv4: 01.2.3.4
  * keywords without `type` ({"maxLength": 2}), anyOf/oneOf next to other keywords, allOf with
    several schemas, required names missing from properties, enum filtered by type,
    uniqueItems: true: xgrammar ignores these (looser); we honour or refuse them
  * extra property names spelled with escapes of declared characters ("\\u0061"): we refuse
"""
import datetime
import json
import random
import uuid
from functools import cache

import jsonschema
import pytest

from course.s08_structured.automaton import compile_automaton
from course.s08_structured.bench.testing import accepts
from course.s08_structured.frontends.ebnf import to_ebnf
from course.s08_structured.grammar import GrammarError
from course.s08_structured.json_schema import (EmptySchemaError, SchemaError, UnsupportedSchemaError,
                                               canonical_json, json_schema_to_grammar)
from course.s08_structured.pda import PDA
from course.s08_structured.realworld.schema_suite import canonical_instance

# name -> (schema, strict)
SCHEMAS = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {"type": "object", "properties": {"street": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name"]}, True),
    "optional_positions": ({"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "integer"},
        "d": {"enum": ["x", "y"]}, "e": {"type": "number"}}, "required": ["b", "d"]}, True),
    "all_optional": ({"type": "object", "properties": {
        "p": {"type": "number"}, "q": {"type": "string"}, "r": {"type": "array", "items": {"type": "integer"}}}},
        True),
    "bounded_array": ({"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3},
                       "minItems": 2, "maxItems": 4}, True),
    "tuple": ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
               "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}, True),
    "closed_tuple": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "null"}]}, True),
    "enum": ({"enum": ["red", "green", 1, None, True, [1, "a"], {"k": "v"}]}, True),
    "enum_and_type": ({"type": ["string", "integer"], "enum": ["a", 1, 2.5, None, "b", 3.0]}, True),
    "any_of": ({"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 2},
                          {"type": "null"}]}, True),
    "tree": ({"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}},
        "required": ["value"]}}, "$ref": "#/$defs/node"}, True),
    "linked_list": ({"type": "object", "properties": {
        "v": {"type": "string", "maxLength": 3},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"]}, True),
    "negative_range": ({"type": "integer", "exclusiveMinimum": -50, "maximum": -7}, True),
    "formats": ({"type": "object", "properties": {
        "date": {"type": "string", "format": "date"}, "time": {"type": "string", "format": "time"},
        "when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"}}}, True),
    "discriminated": ({"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 0}},
         "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
         "required": ["kind", "side"]}]}, True),
    "open_object": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                     "required": ["a"]}, False),
    "extra_schema": ({"properties": {"id": {"type": "integer"}, "ab": {"type": "null"}},
                      "additionalProperties": {"type": "boolean"}}, False),
    "typeless": ({"maxLength": 2, "minItems": 1, "required": ["k"]}, False),
    "all_of": ({"type": "object", "allOf": [
        {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"a": {"minimum": 0}, "b": {"type": "string"}}}]}, False),
    "pattern": ({"type": "string", "pattern": "^[a-c]+-[0-9]{2}$|x0"}, False),
}


def spec_equivalent(schema, strict: bool):
    """The schema with strict mode's defaults written out, so that jsonschema reads it the way
    strict mode does: objects that declare members are closed, prefixItems alone are all the
    items. (Good for SCHEMAS, whose combinator branches are whole object schemas.)"""
    if not strict or not isinstance(schema, dict):
        return schema
    out = {k: spec_equivalent(v, strict) if k in ("additionalProperties", "items") else v
           for k, v in schema.items()}
    for key in ("properties", "$defs"):
        if key in schema:
            out[key] = {k: spec_equivalent(v, strict) for k, v in schema[key].items()}
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if key in schema:
            out[key] = [spec_equivalent(v, strict) for v in schema[key]]
    if ("properties" in schema or "required" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    if "prefixItems" in schema and "items" not in schema:
        out["items"] = False
    return out


@cache
def compiled(name: str):
    schema, strict = SCHEMAS[name]
    pda = PDA(compile_automaton(json_schema_to_grammar(schema, strict=strict)))
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER if strict else None
    validator = jsonschema.Draft202012Validator(spec_equivalent(schema, strict), format_checker=checker)
    return pda, validator


def verdicts(name: str, value) -> tuple[bool, bool]:
    pda, validator = compiled(name)
    schema = SCHEMAS[name][0]
    return accepts(pda, canonical_instance(value, schema, schema)), validator.is_valid(value)


# ------------------------------------------------------------------ values near a schema
CHARS = list("abcx09-/ \"\\\n\té😀")


def any_json(rng: random.Random, depth: int = 2):
    kind = rng.randrange(7 if depth > 0 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-200, 200)
    if kind == 2:
        return round(rng.uniform(-1e3, 1e3), rng.randrange(3))
    if kind in (3, 4):
        return "".join(rng.choices(CHARS, k=rng.randrange(6)))
    if kind == 5:
        return [any_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {"".join(rng.choices(CHARS, k=rng.randrange(4))): any_json(rng, depth - 1) for _ in range(rng.randrange(4))}


def digits(rng, lo, hi, width=2):
    return f"{rng.randint(lo, hi):0{width}d}"


def a_time(rng):
    frac = rng.choice(["", "", ".5", ".123"])
    if rng.random() < 0.6:  # well formed
        return f"{digits(rng, 0, 23)}:{digits(rng, 0, 59)}:{digits(rng, 0, 59)}{frac}{rng.choice(['Z', 'z', '+01:00', '-23:59'])}"
    zone = rng.choice(["Z", "z", "+01:00", "-23:59", "", "+24:00", "+01:60"])
    return f"{digits(rng, 0, 25)}:{digits(rng, 0, 61)}:{digits(rng, 0, 61)}{frac}{zone}"


def a_date(rng):
    if rng.random() < 0.7:
        return (datetime.date(1, 1, 1) + datetime.timedelta(days=rng.randrange(3652059))).isoformat()
    return f"{rng.choice(['0000', '1900', '2000', '2023', '2024', '0400'])}-{digits(rng, 0, 13)}-{digits(rng, 0, 32)}"


FORMATS = {
    "date": a_date, "time": a_time, "date-time": lambda rng: a_date(rng) + rng.choice("Tt ") + a_time(rng),
    "uuid": lambda rng: rng.choice([str, str, str, lambda u: u.hex, lambda u: str(u).upper(), lambda u: str(u)[:-1] + "g"])(
        uuid.UUID(int=rng.getrandbits(128))),
    "ipv4": lambda rng: ".".join(rng.choice(["0", "7", "99", "100", "199", "249", "255", "01", "256"])
                                 for _ in range(rng.choice([3, 4, 4, 4, 4, 5]))),
}


def near(schema, root, rng: random.Random, depth: int = 2):
    """A value of about the schema's shape: most are almost right, many are wrong somewhere."""
    if not isinstance(schema, dict) or depth < 0:
        return any_json(rng)
    makers = [lambda: any_json(rng)]
    if "$ref" in schema:
        target = root if schema["$ref"] == "#" else root["$defs"][schema["$ref"].split("/")[-1]]
        makers.append(lambda: near(target, root, rng, depth - 1))
    for key in ("anyOf", "oneOf", "allOf"):
        makers += [lambda sub=sub: near(sub, root, rng, depth) for sub in schema.get(key, ())]
    if "enum" in schema:
        makers.append(lambda: rng.choice(schema["enum"]))
    if "const" in schema:
        makers += [lambda: schema["const"]] * 2
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    simple = {"null": lambda: None, "boolean": lambda: rng.random() < 0.5, "number": lambda: rng.choice([7, -0.5, 1e-3]),
              "string": lambda: "".join(rng.choices(CHARS, k=rng.randrange(5)))}
    makers += [simple[t] for t in types if t in simple] * 3
    if "integer" in types or "number" in types or "minimum" in schema:
        lo = int(schema.get("minimum", schema.get("exclusiveMinimum", -20)))
        hi = int(schema.get("maximum", schema.get("exclusiveMaximum", lo + 40)))
        makers += [lambda: rng.randint(lo - 4, hi + 4)] * 4
    if "format" in schema:
        makers += [lambda: FORMATS[schema["format"]](rng)] * 3
    if "pattern" in schema:
        makers += [lambda: "".join(rng.choices(["a", "b", "c", "d", "-", "x0", "1", "2", "99"], k=rng.randrange(6)))] * 2
    if "maxLength" in schema:
        makers.append(lambda: "".join(rng.choices(CHARS, k=rng.randrange(schema["maxLength"] + 2))))
    props = schema.get("properties", {})
    if props or "required" in schema:
        def an_object():
            names = list(props) + [n for n in schema.get("required", ()) if n not in props]
            needed = set(schema.get("required", ())) if rng.random() < 0.7 else set()
            value = {n: near(props.get(n, {}), root, rng, depth - 1) for n in names
                     if n in needed or rng.random() < 0.5}
            for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):
                value[rng.choice(["zz", "a", "ab", "id", "k", "\\", "é"])] = any_json(rng, 0)
            return dict(rng.sample(list(value.items()), len(value)))  # any order: the writer sorts
        makers += [an_object] * 3
    if "items" in schema or "prefixItems" in schema:
        def an_array():
            heads = [near(sub, root, rng, depth - 1) for sub in schema.get("prefixItems", ())]
            heads = heads[:rng.randrange(len(heads) + 1)] if rng.random() < 0.3 else heads
            count = rng.randint(schema.get("minItems", 0), schema.get("maxItems", 3)) if rng.random() < 0.7 else rng.randrange(6)
            return heads + [near(schema.get("items", {}), root, rng, depth - 1) for _ in range(max(count - len(heads), 0))]
        makers += [an_array] * 3
    return rng.choice(makers)()


def values_near(name: str, count: int):
    rng = random.Random(name)  # the same values every run
    schema = SCHEMAS[name][0]
    return [near(schema, schema, rng) for _ in range(count)]


@pytest.mark.parametrize("name", SCHEMAS)
def test_accepts_exactly_the_valid_values(name):
    values = values_near(name, 400)
    verdict = [verdicts(name, v) for v in values]
    wrong = [(canonical_json(v), ours, theirs) for v, (ours, theirs) in zip(values, verdict) if ours != theirs]
    assert not wrong, f"(value, grammar, jsonschema): {wrong[:5]}"
    assert any(ours for ours, _ in verdict) and not all(ours for ours, _ in verdict), "one-sided sample"


# name, value, valid: both verdicts for every schema, and the edges we care about
TABLE = [
    ("person", {"name": "Ada"}, True),
    ("person", {"name": "Ada", "age": 36, "address": {"street": "x", "zip": "12345"}, "tags": ["a", "b"]}, True),
    ("person", {"name": ""}, False),
    ("person", {"name": "a\"\\\n\t😀é"}, True),
    ("person", {"name": "123456789"}, False),
    ("person", {"name": "Ada", "age": 151}, False),
    ("person", {"name": "Ada", "address": {"zip": "12345"}}, False),
    ("person", {"name": "Ada", "address": {"street": "", "zip": "1234"}}, False),
    ("person", {"name": "Ada", "tags": ["a", "b", "c", "d"]}, False),
    ("person", {"name": "Ada", "nick": "A"}, False),
    ("optional_positions", {"b": None, "d": "x"}, True),
    ("optional_positions", {"a": True, "b": None, "c": -4, "d": "y", "e": 1.5e-3}, True),
    ("optional_positions", {"a": False, "b": None, "d": "x", "e": 2}, True),
    ("optional_positions", {"a": False, "d": "x"}, False),
    ("optional_positions", {"b": None, "d": "z"}, False),
    ("all_optional", {}, True),
    ("all_optional", {"r": []}, True),
    ("all_optional", {"p": -0.5, "r": [1, 2]}, True),
    ("all_optional", {"q": 1}, False),
    ("bounded_array", [3, -3], True),
    ("bounded_array", [0, 0, 0, 0], True),
    ("bounded_array", [0], False),
    ("bounded_array", [0, 0, 0, 0, 0], False),
    ("bounded_array", [0, 4], False),
    ("tuple", ["a"], True),
    ("tuple", ["a", 1, True], True),
    ("tuple", ["a", 1, True, False], False),
    ("tuple", [], False),
    ("tuple", [1], False),
    ("closed_tuple", [], True),
    ("closed_tuple", [1, None], True),
    ("closed_tuple", [1, None, None], False),
    ("enum", [1, "a"], True),
    ("enum", {"k": "v"}, True),
    ("enum", 1.0, True),
    ("enum", "blue", False),
    ("enum", [1], False),
    ("enum_and_type", "a", True),
    ("enum_and_type", 3, True),
    ("enum_and_type", 2.5, False),
    ("enum_and_type", None, False),
    ("any_of", 10, True),
    ("any_of", "ab", True),
    ("any_of", None, True),
    ("any_of", 9, False),
    ("any_of", "abc", False),
    ("tree", {"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}, True),
    ("tree", {"value": 1, "children": [{"children": []}]}, False),
    ("tree", {"value": 1, "children": [{"value": 1}] * 4}, False),
    ("linked_list", {"v": "a", "next": {"v": "b", "next": None}}, True),
    ("linked_list", {"v": "a", "next": {"v": "b"}}, False),
    ("negative_range", -49, True),
    ("negative_range", -7, True),
    ("negative_range", -50, False),
    ("negative_range", -6, False),
    ("formats", {"date": "2024-02-29", "time": "23:59:59.5+01:00", "when": "2000-01-01t00:00:00z",
                 "id": "123e4567-E89B-12d3-a456-426614174000", "ip": "255.0.10.1"}, True),
    ("formats", {"date": "2023-02-29"}, False),
    ("formats", {"date": "1900-02-29"}, False),
    ("formats", {"date": "0000-01-01"}, False),
    ("formats", {"date": "2023-04-31"}, False),
    ("formats", {"time": "12:00:00"}, False),
    ("formats", {"time": "24:00:00Z"}, False),
    ("formats", {"when": "2000-01-01T00:00:60Z"}, False),
    ("formats", {"ip": "01.2.3.4"}, False),
    ("formats", {"ip": "256.2.3.4"}, False),
    ("discriminated", {"kind": "circle", "r": 2}, True),
    ("discriminated", {"kind": "square", "side": -2}, True),
    ("discriminated", {"kind": "circle", "side": 2}, False),
    ("discriminated", {"kind": "circle", "r": -1}, False),
    ("open_object", {"a": 1, "zz": [1]}, True),
    ("open_object", {"a": 1, "b": "x", "c": {}, "d": None}, True),
    ("open_object", {"a": "x"}, False),
    ("open_object", {"a": 1, "b": 2}, False),
    ("extra_schema", {"id": 1, "x": True}, True),
    ("extra_schema", {"a": True, "abc": False}, True),
    ("extra_schema", "not an object", True),
    ("extra_schema", {"x": 1}, False),
    ("extra_schema", {"id": True}, False),
    ("typeless", 12.5, True),
    ("typeless", "ab", True),
    ("typeless", "abc", False),
    ("typeless", [], False),
    ("typeless", {"k": 1, "j": 2}, True),
    ("typeless", {"j": 2}, False),
    ("all_of", {"a": 0, "b": "x"}, True),
    ("all_of", {"a": -1}, False),
    ("all_of", {"a": 1.5}, False),
    ("all_of", {"b": "x"}, False),
    ("pattern", "ab-12", True),
    ("pattern", "zzx0zz", True),
    ("pattern", "ab-123", False),
    ("pattern", "d-12", False),
]


@pytest.mark.parametrize("name,value,valid", TABLE)
def test_table(name, value, valid):
    ours, theirs = verdicts(name, value)
    assert theirs == valid, "the table disagrees with jsonschema"
    assert ours == valid


def test_spelling_is_canonical():
    """One spelling per value: ", " and ": ", declared order, 1.0 written as 1, no escapes
    beyond json.dumps's."""
    pda, _ = compiled("optional_positions")
    assert accepts(pda, '{"a": true, "b": null, "d": "x", "e": 1.5}')
    for other in ['{"a":true, "b": null, "d": "x"}', '{"b": null, "a": true, "d": "x"}',
                  '{ "b": null, "d": "x"}', '{"b": null, "d": "x" }', '{"b": null,"d": "x"}']:
        assert not accepts(pda, other), other
    enum_pda, _ = compiled("enum")
    assert accepts(enum_pda, "1") and not accepts(enum_pda, "1.0") and not accepts(enum_pda, "[1,\"a\"]")


# ------------------------------------------------------------------ integers
@pytest.mark.parametrize("bounds", [
    {"minimum": -15, "maximum": 123}, {"minimum": -1000, "maximum": -7}, {"minimum": 0, "maximum": 0},
    {"minimum": 95}, {"maximum": -3}, {"exclusiveMinimum": -3, "exclusiveMaximum": 7},
    {"minimum": 99, "maximum": 1000}, {"minimum": 100, "maximum": 999}, {"minimum": 7.5, "maximum": 20.5},
    {"exclusiveMinimum": 7.5, "exclusiveMaximum": 20.0}, {"minimum": 1e3}, {"minimum": -5, "exclusiveMinimum": -2},
    {"minimum": 10, "maximum": 10}, {"minimum": 1234, "maximum": 56789}, {"minimum": -99, "maximum": 99}])
def test_integer_ranges(bounds):
    grammar = json_schema_to_grammar({"type": "integer", **bounds})
    pda = PDA(compile_automaton(grammar))
    lows = [bounds["minimum"]] if "minimum" in bounds else []
    lows += [bounds["exclusiveMinimum"] + 1e-9] if "exclusiveMinimum" in bounds else []
    highs = [bounds["maximum"]] if "maximum" in bounds else []
    highs += [bounds["exclusiveMaximum"] - 1e-9] if "exclusiveMaximum" in bounds else []
    edges = [int(b) for b in lows + highs]
    window = {n for e in edges for n in range(e - 120, e + 121)} | {0, 1, -1, 10 ** 6, -10 ** 6, 10 ** 30}
    for n in sorted(window):
        inside = all(n >= lo for lo in lows) and all(n <= hi for hi in highs)
        assert accepts(pda, str(n)) == inside, n
    for spelling in ("-0", "007", "+5", "1.0", "1e3", "", "-"):
        assert not accepts(pda, spelling), spelling


# ------------------------------------------------------------------ where we are stricter (documented)
def test_pattern_characters_that_need_escapes_are_left_out():
    grammar = json_schema_to_grammar({"type": "string", "pattern": '^a(b|"|\\n)c$'})
    assert accepts(grammar, '"abc"')
    assert not accepts(grammar, '"a\\"c"') and not accepts(grammar, '"a\\nc"')  # valid, but not written
    around = json_schema_to_grammar({"type": "string", "pattern": "b"})  # unanchored: anything around
    assert accepts(around, '"\\"\\n b \\u00e9"')


def test_extra_property_names_cannot_disguise_declared_ones():
    grammar = json_schema_to_grammar({"properties": {"a": {"type": "integer"}}}, strict=False)
    assert not accepts(grammar, '{"\\u0061": "x"}')   # that is {"a": "x"}: invalid
    assert not accepts(grammar, '{"\\u0061b": 1}')    # {"ab": 1} is valid, but "a" must be written raw
    assert accepts(grammar, '{"\\u00e9\\n": 1}')      # no declared name has these characters
    assert not accepts(grammar, '{"b": 1, "a": 1}')   # valid, but declared properties come first


def test_lengths_count_characters_not_escapes():
    grammar = json_schema_to_grammar({"type": "string", "minLength": 2, "maxLength": 2})
    assert accepts(grammar, '"\\n\\u00e9"') and accepts(grammar, '"😀😀"')
    assert not accepts(grammar, '"\\ud83d\\ude00"')  # one character (😀) in two escapes


def test_strict_mode_defaults():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "anyOf": [{"required": ["a"]}, {"properties": {"b": {"type": "null"}}, "required": ["b"]}]}
    strict, loose = json_schema_to_grammar(schema), json_schema_to_grammar(schema, strict=False)
    assert accepts(strict, '{"a": 1}') and accepts(strict, '{"b": null}') and accepts(strict, '{"a": 1, "b": null}')
    assert not accepts(strict, '{"a": 1, "c": 2}') and accepts(loose, '{"a": 1, "c": 2}')
    assert not accepts(strict, "{}") and not accepts(loose, "{}")
    assert accepts(json_schema_to_grammar({"type": "object"}), '{"x": [1, {}]}')  # nothing declared: any object
    tuple_ = {"type": "array", "prefixItems": [{"type": "integer"}]}
    assert not accepts(json_schema_to_grammar(tuple_), "[1, 2]")
    assert accepts(json_schema_to_grammar(tuple_, strict=False), '[1, "x"]')
    date = {"type": "string", "format": "date"}
    assert not accepts(json_schema_to_grammar(date), '"x"') and accepts(json_schema_to_grammar(date, strict=False), '"x"')


def test_schema_given_as_text_and_booleans():
    assert accepts(json_schema_to_grammar('{"type": "integer"}'), "-12")
    assert accepts(json_schema_to_grammar(True), '[{"a": null}, "\\u0000"]')
    assert accepts(json_schema_to_grammar({"title": "x", "description": "y", "$id": "urn:x"}), "1")


# ------------------------------------------------------------------ errors
ERRORS = [  # schema, strict, error class, words the message must contain
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}, True,
     UnsupportedSchemaError, ["'uniqueItems'", "#/properties/tags"]),
    ({"not": {"minimum": 3}}, True, UnsupportedSchemaError, ["'not'", "#/not"]),
    ({"properties": {"a": {"if": {"minLength": 2}, "then": {}}}}, False, UnsupportedSchemaError,
     ["'if'", "#/properties/a"]),
    ({"patternProperties": {"^x": {}}}, False, UnsupportedSchemaError, ["'patternProperties'"]),
    ({"items": {"multipleOf": 2}}, False, UnsupportedSchemaError, ["'multipleOf'", "#/items"]),
    ({"type": "array", "items": {"uniqueItems": True}}, False, UnsupportedSchemaError, ["'uniqueItems'", "#/items"]),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, True, UnsupportedSchemaError, ["'oneOf'", "#"]),
    ({"$defs": {"a": {"minProperties": 1}}, "$ref": "#/$defs/a"}, True, UnsupportedSchemaError,
     ["'minProperties'", "#/$defs/a"]),
    ({"$ref": "https://example.com/s.json"}, True, UnsupportedSchemaError, ["'$ref'", "remote"]),
    ({"$ref": "#foo"}, True, UnsupportedSchemaError, ["'$anchor'"]),
    ({"properties": {"a": {"$id": "a.json"}}}, True, UnsupportedSchemaError, ["'$id'", "#/properties/a"]),
    ({"type": "string", "format": "idn-email"}, True, UnsupportedSchemaError, ["'format'", "idn-email"]),
    ({"type": "string", "format": "hostname"}, True, UnsupportedSchemaError, ["'format'", "hostname"]),
    ({"type": "string", "pattern": "a", "maxLength": 3}, True, UnsupportedSchemaError, ["'pattern'", "maxLength"]),
    ({"type": "string", "pattern": "(a)\\1"}, True, UnsupportedSchemaError, ["'pattern'", "backreference"]),
    ({"anyOf": [{"enum": [i, i + 1]} for i in range(3)], "allOf": [
        {"anyOf": [{"minItems": i} for i in range(5)]}, {"anyOf": [{"maxItems": 9 + i} for i in range(5)]}]},
     True, UnsupportedSchemaError, ["combinations"]),
    # a const that our (stricter) pattern grammar rejects is still valid for that branch: no proof
    ({"oneOf": [{"const": 'a"b'}, {"type": "string", "pattern": '"'}]}, True, UnsupportedSchemaError, ["'oneOf'"]),
    ({"oneOf": [{"const": {"y": 1, "x": 2}}, {"type": "object", "properties": {"x": {}, "y": {}}}]}, False,
     UnsupportedSchemaError, ["'oneOf'"]),
    ({"type": "strings"}, True, SchemaError, ["'type'", "#"]),
    ({"type": "object", "properties": {"a": {"required": "a"}}}, True, SchemaError,
     ["'required'", "#/properties/a"]),
    ({"minItems": 3, "maxItems": 2}, True, SchemaError, ["minItems > maxItems"]),
    ({"items": [{"type": "integer"}]}, True, SchemaError, ["prefixItems"]),
    ({"if": 5, "then": {}}, True, SchemaError, ["'if'", "a schema"]),
    ({"dependentRequired": {"a": "b"}}, True, SchemaError, ["'dependentRequired'", "property-name arrays"]),
    ({"$ref": "#/$defs/missing"}, True, SchemaError, ["#/$defs/missing"]),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, True, SchemaError, ["cycle"]),
    ({"type": "object", "required": ["z"]}, True, SchemaError, ["'z'", "strict"]),
    ("{not json", True, SchemaError, ["not valid JSON"]),
    (False, True, EmptySchemaError, ["no JSON value"]),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, False, EmptySchemaError, ["no JSON value"]),
]


@pytest.mark.parametrize("schema,strict,error,words", ERRORS)
def test_errors(schema, strict, error, words):
    with pytest.raises(error) as info:
        json_schema_to_grammar(schema, strict=strict)
    assert isinstance(info.value, GrammarError)
    for word in words:
        assert word in str(info.value), str(info.value)
    if error is UnsupportedSchemaError:
        assert info.value.feature in str(info.value) and info.value.pointer in str(info.value)


def test_ignored_without_their_partner():
    """minContains without contains and then/else without if do nothing (as the spec says)."""
    grammar = json_schema_to_grammar({"type": "array", "minContains": 2, "then": {"type": "string"}})
    assert accepts(grammar, "[1]")


# ------------------------------------------------------------------ size
def test_grammar_stays_small():
    """Optional properties: one rule per property, not one alternative per subset."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}
    grammar = json_schema_to_grammar(schema)
    assert len(grammar.rules) < 50 and len(to_ebnf(grammar)) < 6000
    text = "{" + ", ".join(f'"p{i}": {i}' for i in range(0, 40, 3)) + "}"
    assert accepts(grammar, text)
    nested = {"type": "object", "properties": {"x": {"type": "integer"}}}
    for _ in range(30):
        nested = {"type": "object", "properties": {"x": nested, "y": {"type": "string"}}}
    assert len(to_ebnf(json_schema_to_grammar(nested))) < 20000


# ------------------------------------------------------------------ agreement with xgrammar
XGRAMMAR_EXACT = ["optional_positions", "all_optional", "bounded_array", "tuple", "closed_tuple",
                  "tree", "negative_range", "discriminated"]


@cache
def xgrammar_matchers(name):
    xgr = pytest.importorskip("xgrammar")
    from course.s01_decode_loop.testing import byte_tokenizer

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(byte_tokenizer(), vocab_size=258))
    schema = SCHEMAS[name][0]
    theirs = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    ours_there = compiler.compile_grammar(xgr.Grammar.from_ebnf(to_ebnf(json_schema_to_grammar(schema))))

    def run(compiled, text):
        matcher = xgr.GrammarMatcher(compiled)
        return matcher.accept_string(text) and matcher.is_completed()

    return lambda text: run(theirs, text), lambda text: run(ours_there, text)


@pytest.mark.parametrize("name", XGRAMMAR_EXACT)
def test_same_language_as_xgrammar(name):
    """Same strings as xgrammar's own converter; and xgrammar reading our EBNF agrees with our
    automaton (so the printer is right too)."""
    theirs, ours_in_xgrammar = xgrammar_matchers(name)
    schema, pda = SCHEMAS[name][0], compiled(name)[0]
    for value in values_near(name, 150):
        text = canonical_instance(value, schema, schema)
        assert accepts(pda, text) == theirs(text) == ours_in_xgrammar(text), text
