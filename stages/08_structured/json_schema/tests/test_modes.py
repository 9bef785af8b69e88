"""Strict and best-effort mode (json_schema/modes.py), and unknown keywords.

For every keyword we cannot enforce: strict mode refuses the schema naming the keyword and
where it is; best-effort mode compiles it, reports exactly that relaxation, accepts every value
the schema accepts (relaxing only ever adds values), and really is looser (an invalid value it
now accepts is shown, so a warning that claims a relaxation that never happened would fail too).
"""
import jsonschema
import pytest

from course.s08_structured.json_schema import (BEST_EFFORT, STRICT, SchemaWarning, UnsupportedSchemaError,
                                               canonical_json, json_schema_to_grammar)
from course.s08_structured.json_schema.modes import Relaxer
from course.s08_structured.bench.testing import accepts

# schema, keyword, pointer, a value the relaxed grammar accepts although the schema rejects it
RELAXATIONS = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "#", [1, 1]),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, "oneOf", "#", 1),
    ({"type": "integer", "multipleOf": 5}, "multipleOf", "#", 3),
    ({"type": "object", "minProperties": 1}, "minProperties", "#", {}),
    ({"type": "array", "contains": {"const": 1}}, "contains", "#", [2]),
    ({"type": "string", "format": "idn-email"}, "format", "#", "x"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, "pattern", "#", "aaa"),
    ({"type": "string", "format": "date", "minLength": 20}, "format", "#", "2024-01-01"),
    ({"type": "integer", "not": {"minimum": 3}}, "not", "#/not", 5),
    ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}, "else": {"maximum": 10}}, "if", "#", 7),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}, "required": ["a"]},
     "$ref", "#/properties/a", None),  # not invalid per se: jsonschema cannot fetch it either (skipped)
    ({"type": "object", "propertyNames": {"maxLength": 2}}, "propertyNames", "#", {"abc": 1}),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True, "unevaluatedProperties": False},
     "unevaluatedProperties", "#", None),  # jsonschema agrees the extra is fine here: only the warning is checked
    ({"type": "string", "pattern": "(a)\\1"}, "pattern", "#", "b"),
    ({"type": "object", "properties": {"a": {}}, "patternProperties": {"^a": {"type": "integer"}}},
     "patternProperties", "#", {"a": "x"}),
    ({"type": "string", "not": {"const": "ab"}, "maxLength": 3}, "not", "#/not", "ab"),
]
CANDIDATES = [None, True, 0, 1, 3, 5, 7, 10, 12, -4, 1.5, "", "a", "aa", "aaa", "ab", "x", "2024-01-01",
              "2024-01-01T00:00:00Z", [], [1], [1, 1], [1, 2], [2], ["a"], {}, {"a": 1}, {"abc": 1}, {"a": 1, "b": 2}]


def ids(case):
    return f"{case[1]}@{case[2]}" if isinstance(case, tuple) else None


@pytest.mark.parametrize("case", RELAXATIONS, ids=[ids(c) for c in RELAXATIONS])
def test_strict_mode_refuses_naming_the_keyword(case):
    schema, keyword, pointer, _ = case
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_grammar(schema, mode=STRICT)
    assert info.value.feature == keyword and info.value.pointer == pointer


@pytest.mark.parametrize("case", RELAXATIONS, ids=[ids(c) for c in RELAXATIONS])
def test_best_effort_relaxes_reports_and_never_drops_a_valid_value(case):
    schema, keyword, pointer, looser = case
    grammar = json_schema_to_grammar(schema, mode=BEST_EFFORT)
    assert [(w.feature, w.pointer) for w in grammar.warnings] == [(keyword, pointer)]
    assert "not enforced" in str(grammar.warnings[0]) and grammar.warnings[0].to_json()["keyword"] == keyword
    if keyword == "$ref":
        return  # jsonschema cannot resolve the remote reference either
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for value in CANDIDATES:
        if check.is_valid(value):
            assert accepts(grammar, canonical_json(value)), value
    if looser is not None:
        assert accepts(grammar, canonical_json(looser)) and not check.is_valid(looser)


def test_unknown_keywords_are_annotations_in_both_modes():
    """JSON Schema: unknown keywords are ignored. A warning still names each (a typo shows)."""
    plain = json_schema_to_grammar({"type": "integer", "maximum": 9})
    for mode in (STRICT, BEST_EFFORT):
        grammar = json_schema_to_grammar({"type": "integer", "maximum": 9, "_uniqueItems": True,
                                          "x-vendor": {"type": "string"}, "maxValue": 3}, mode=mode)
        assert grammar.rules == plain.rules
        assert [w.feature for w in grammar.warnings] == ["_uniqueItems", "x-vendor", "maxValue"]
        assert all("unknown keyword" in str(w) for w in grammar.warnings)


def test_an_exact_schema_has_no_warnings_in_either_mode():
    schema = {"type": "object", "properties": {"n": {"type": "number", "minimum": 0.5}}, "required": ["n"]}
    assert json_schema_to_grammar(schema).warnings == json_schema_to_grammar(schema, mode=BEST_EFFORT).warnings == ()


def test_each_relaxation_is_reported_once_and_in_order():
    item = {"type": "array", "uniqueItems": True}
    schema = {"type": "object", "properties": {"a": item, "b": {"type": "integer", "multipleOf": 2}},
              "$defs": {"tags": item}}
    warnings = json_schema_to_grammar(schema, mode=BEST_EFFORT).warnings
    assert warnings == (SchemaWarning("uniqueItems", "#/properties/a", warnings[0].relaxed_to),
                        SchemaWarning("multipleOf", "#/properties/b", warnings[1].relaxed_to))


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="best-effort"):
        Relaxer("lenient")
    with pytest.raises(ValueError):
        json_schema_to_grammar({}, mode="lenient")


def test_a_required_property_never_declared_is_allowed_with_any_value_in_best_effort():
    # drone-ci's volumes: a oneOf branch requires "path", which no "properties" declares. The
    # strict reading (no undeclared properties) makes such an object impossible: strict mode
    # refuses it, best-effort allows the property with any value and says so.
    from course.s08_structured.json_schema.keywords import SchemaError

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name", "path"]}
    with pytest.raises(SchemaError, match="'path'"):
        json_schema_to_grammar(schema, mode=STRICT)
    grammar = json_schema_to_grammar(schema, mode=BEST_EFFORT)
    assert [(w.feature, w.pointer) for w in grammar.warnings] == [("required", "#")]
    assert "'path'" in str(grammar.warnings[0])
    for value in ({"name": "v", "path": 1}, {"name": "v", "path": {"a": [True]}}):
        assert accepts(grammar, canonical_json(value)) and jsonschema.Draft202012Validator(schema).is_valid(value)
    for value in ({"name": "v"}, {"name": "v", "path": 1, "other": 2}):
        assert not accepts(grammar, canonical_json(value))
