"""The vocabulary of JSON Schema as this front end reads it: the errors it raises, which keywords
exist, what each keyword's value must be, and the canonical spelling of JSON values."""
from __future__ import annotations

import json
import math

from ..grammar import GrammarError


class SchemaError(GrammarError):
    """The schema itself is malformed (a wrong keyword value, a dangling $ref, ...)."""


class EmptySchemaError(SchemaError):
    """The schema is well formed but no JSON value satisfies it (e.g. `false`)."""


class UnsupportedSchemaError(GrammarError):
    """A valid schema that uses a feature we cannot compile exactly. `feature` is the keyword,
    `pointer` the JSON pointer of the schema object that uses it."""

    def __init__(self, feature: str, pointer: str, detail: str = ""):
        self.feature, self.pointer = feature, pointer
        super().__init__(f"unsupported JSON Schema feature '{feature}' at {pointer}"
                         + (f": {detail}" if detail else ""))


TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"title", "description", "$comment", "examples", "default", "deprecated",
                         "readOnly", "writeOnly", "$schema", "contentMediaType", "contentEncoding",
                         "contentSchema"})
VALUE_KEYWORDS = ("type", "enum", "const", "properties", "required", "additionalProperties",
                  "prefixItems", "items", "minItems", "maxItems", "uniqueItems", "minLength",
                  "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                  "exclusiveMaximum")
COMBINATORS = ("$ref", "allOf", "anyOf", "oneOf")
BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# Keywords that do nothing without a partner keyword, as the specification says.
PARTNERS = {"minContains": "contains", "maxContains": "contains", "then": "if", "else": "if"}
# Compiled by reduction to alternatives (flatten.py): a schema, or a list of names.
REDUCED = ("not", "if", "dependentRequired", "dependentSchemas", "dependencies")
# Known keywords no grammar here enforces: refused in strict mode, ignored with a warning in
# best-effort mode (what is enforced instead).
RELAXED = {
    "propertyNames": "ignored: any property name is allowed",
    "minProperties": "ignored: any number of properties", "maxProperties": "ignored: any number of properties",
    "contains": "ignored: any items", "minContains": "ignored", "maxContains": "ignored",
    "multipleOf": "ignored: any number within the other keywords",
    "unevaluatedProperties": "read as additionalProperties' alternative: an extra property may take its schema",
    "unevaluatedItems": "ignored: extra items follow items",
    "additionalItems": "ignored (draft 2019 and older; use items with prefixItems)",
    "$dynamicRef": "ignored: any value", "$recursiveRef": "ignored: any value",
    "$dynamicAnchor": "ignored", "$recursiveAnchor": "ignored", "$anchor": "ignored", "$vocabulary": "ignored",
}


def canonical_json(value) -> str:
    """The one spelling the grammars produce: json.dumps(ensure_ascii=False) with integral
    floats written as integers (JSON Schema treats 1.0 and 1 as the same number)."""
    return json.dumps(_integral_floats_as_ints(value), ensure_ascii=False)


def _integral_floats_as_ints(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    return value


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def same_json(a, b) -> bool:
    """JSON equality: 1 == 1.0, but true != 1 and key order does not matter."""
    return json_key(a) == json_key(b)


def json_key(value) -> str:
    """A string that is equal for exactly the JSON-equal values (for sets and dicts)."""
    return json.dumps(_integral_floats_as_ints(value), sort_keys=True)


# ------------------------------------------------------------------ checking one schema object
def check_schema(schema, path: str, checked: set[int], relaxer) -> None:
    """Refuse a malformed keyword in one schema object; refuse (strict) or relax with a warning
    (best-effort) one we cannot enforce, through `relaxer` (modes.Relaxer); ignore
    unknown keywords as annotations, with a warning. Sub-schemas are checked when they are
    reached; `checked` holds the ids of objects already checked."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"the schema at {path} must be an object or a boolean, "
                          f"not {type(schema).__name__}")
    if id(schema) in checked:
        return
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key == "$id":
            if path != "#":
                relaxer.relax("$id", path, "an embedded resource changes how references inside it resolve",
                              "ignored: references resolve against the whole document")
        elif key in ("$defs", "definitions"):
            if not isinstance(value, dict):
                raise SchemaError(f"'{key}' at {path} must be an object")
        elif key in VALUE_KEYWORDS or key in COMBINATORS:
            _check_value(key, value, path)
        elif key in PARTNERS and PARTNERS[key] not in schema:
            continue  # minContains without contains, then without if: no effect
        elif key in ("not", "if", "then", "else"):
            if not isinstance(value, (dict, bool)):
                raise SchemaError(f"'{key}' at {path} must be a schema, not {json.dumps(value)[:60]}")
        elif key in ("dependentSchemas", "patternProperties"):
            if not isinstance(value, dict) or not all(isinstance(v, (dict, bool)) for v in value.values()):
                raise SchemaError(f"'{key}' at {path} must be an object whose values are schemas")
        elif key in ("dependentRequired", "dependencies"):
            if not isinstance(value, dict) or not all(
                    isinstance(v, (dict, bool)) or (isinstance(v, list) and all(isinstance(n, str) for n in v))
                    for v in value.values()) or (key == "dependentRequired" and not all(
                    isinstance(v, list) for v in value.values())):
                raise SchemaError(f"'{key}' at {path} must be an object of property-name arrays"
                                  + (" or schemas" if key == "dependencies" else ""))
        elif key in RELAXED:
            relaxer.relax(key, path, "", RELAXED[key])
        else:
            relaxer.note(key, path, "unknown keyword: ignored as an annotation, as the specification says",
                         kind="ignored")
    for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength"), ("minimum", "maximum")):
        if lo in schema and hi in schema and schema[lo] > schema[hi]:
            raise SchemaError(f"{lo} > {hi} at {path}")
    checked.add(id(schema))


def _check_value(key: str, value, path: str) -> None:
    """Malformed keyword values are schema errors, reported with where they are."""
    def bad(what: str):
        raise SchemaError(f"'{key}' at {path} must be {what}, not {json.dumps(value)[:60]}")

    def is_schema(v):
        return isinstance(v, (dict, bool))

    def is_count(v):
        return (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or \
            (isinstance(v, float) and v.is_integer() and v >= 0)

    if key == "type":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or any(n not in TYPES for n in names) \
                or len(set(names)) != len(names):
            bad(f"one of {', '.join(TYPES)} or a non-empty list of them")
    elif key == "enum" and not isinstance(value, list):
        bad("an array")
    elif key == "required" and (not isinstance(value, list) or not all(isinstance(n, str) for n in value)):
        bad("an array of strings")
    elif key == "properties" and (not isinstance(value, dict) or not all(map(is_schema, value.values()))):
        bad("an object whose values are schemas")
    elif key == "items" and isinstance(value, list):
        bad("a schema (an array of schemas is 'prefixItems' in draft 2020-12)")
    elif key in ("additionalProperties", "items") and not is_schema(value):
        bad("a schema")
    elif key in ("prefixItems", "allOf", "anyOf", "oneOf") and (
            not isinstance(value, list) or not value or not all(map(is_schema, value))):
        bad("a non-empty array of schemas")
    elif key in ("minItems", "maxItems", "minLength", "maxLength") and not is_count(value):
        bad("a non-negative integer")
    elif key in BOUNDS and (isinstance(value, bool) or not isinstance(value, (int, float))
                            or (isinstance(value, float) and not math.isfinite(value))):
        bad("a finite number")
    elif key in ("pattern", "format", "$ref") and not isinstance(value, str):
        bad("a string")
    elif key == "uniqueItems" and not isinstance(value, bool):
        bad("a boolean")


def resolve_pointer(doc, fragment: str):
    """The node a JSON pointer ("/$defs/node", "/properties/a~1b") names in `doc`; KeyError if none."""
    node = doc
    for part in fragment.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(fragment)
    return node
