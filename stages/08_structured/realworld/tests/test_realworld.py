"""Twelve realistic schemas (realworld/schemas/: function-calling tools, GitHub API bodies, forms),
among them four that need more than the basic keywords: a `minimum` on a number (get_weather), an unknown
keyword `_uniqueItems` (github_create_issue), `format: email` (send_email) and draft 7's
`dependencies` (checkout_payment).

Every one compiles in best-effort mode, with exactly the warnings listed here; strict mode
compiles the exact ones and refuses the others naming the keyword. Output drawn from each
grammar validates with jsonschema, except for the relaxed keywords and nothing else.
"""
import json
import random
from functools import cache
from pathlib import Path

import jsonschema
import pytest

from course.s08_structured.automaton import compile_automaton
from course.s08_structured.json_schema import BEST_EFFORT, UnsupportedSchemaError, json_schema_to_grammar
from course.s08_structured.bench.testing import format_checker, sample_strings

FOLDER = Path(__file__).resolve().parent.parent / "schemas"

# name -> what best-effort mode relaxes: (keyword, JSON pointer); strict mode refuses the first
RELAXED = {
    "calendar_event": [],
    "checkout_payment": [("multipleOf", "#/properties/amount")],
    "geo_feature": [("minProperties", "#/properties/properties")],
    "get_weather": [],
    "github_create_issue": [("uniqueItems", "#/properties/assignees")],
    "github_workflow_dispatch": [("maxProperties", "#/properties/inputs"), ("propertyNames", "#/properties/inputs")],
    "http_request_tool": [],
    "product_listing": [("contains", "#/properties/categories")],
    "send_email": [],
    "server_inventory": [("format", "#/properties/hostname")],
    "shipping_address": [],
    "support_ticket_triage": [],
}
IGNORED = {"github_create_issue": [("_uniqueItems", "#/properties/labels")]}  # unknown keywords: annotations


def load(name: str):
    return json.loads((FOLDER / f"{name}.json").read_text())


@cache
def best_effort(name: str):
    return json_schema_to_grammar(load(name), mode=BEST_EFFORT)


def test_the_set_is_all_here():
    assert sorted(p.stem for p in FOLDER.glob("*.json")) == sorted(RELAXED)


@pytest.mark.parametrize("name", RELAXED)
def test_compiles_in_best_effort_mode_with_the_listed_warnings(name):
    grammar = best_effort(name)
    compile_automaton(grammar)  # the automaton that masks are computed from builds too
    assert sorted((w.feature, w.pointer) for w in grammar.warnings) == sorted(IGNORED.get(name, []) + RELAXED[name])


@pytest.mark.parametrize("name", RELAXED)
def test_strict_mode_compiles_the_exact_ones_and_refuses_the_rest(name):
    if not RELAXED[name]:
        assert json_schema_to_grammar(load(name)).rules == best_effort(name).rules
        return
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_grammar(load(name))
    assert (info.value.feature, info.value.pointer) in RELAXED[name]


def closed(schema):
    """Strict reading (generation engines'): objects that declare properties allow no others.
    (Conditions such as if/then/else only add to the object they sit in: not closed there.)"""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema and "additionalProperties" not in schema and "patternProperties" not in schema:
        out["additionalProperties"] = False
    for key in ("properties", "$defs"):
        if key in schema:
            out[key] = {k: closed(v) for k, v in schema[key].items()}
    for key in ("items", "additionalProperties"):
        if key in schema:
            out[key] = closed(schema[key])
    for key in ("prefixItems", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [closed(v) for v in schema[key]]
    return out


@pytest.mark.parametrize("name", RELAXED)
def test_drawn_outputs_validate_but_for_the_relaxed_keywords(name):
    schema = load(name)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)  # by $schema
    check = cls(closed(schema), format_checker=format_checker())
    allowed = {k for k, _ in RELAXED[name]}
    for text in sample_strings(best_effort(name), random.Random(name), 120):
        value = json.loads(text)
        for error in check.iter_errors(value):
            if error.validator == "format":  # only hostname's lengths are relaxed, no other format
                assert error.validator_value == "hostname", (text, error.message)
            relaxed = allowed & {str(part) for part in error.schema_path}  # the keyword, or one above it
            assert relaxed, (text, error.message)
