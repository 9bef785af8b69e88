"""Number bounds, the formats email/hostname/ipv6/uri, dependencies,
if/then/else and not compile to exactly the valid values. Two oracles, as in test_json_schema.py:

* strings *drawn from our grammar* (bench/testing.py's sample_strings) parse and validate with jsonschema
  (formats checked; hostname, ipv6 and uri by bench/testing.py format_checker's own checkers, which
  jsonschema leaves to optional packages);
* for values near each schema, the grammar accepts the canonical spelling exactly when
  jsonschema says the value is valid.

And where xgrammar enforces the same thing (the four formats), the same strings as xgrammar's
own converter (fast, on a byte vocabulary) and the same masks on SmolLM2's vocabulary (slow).
"""
import json
import random
import re
from decimal import Decimal
from functools import cache

import jsonschema
import pytest

from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.realworld.schema_suite import canonical_instance
from course.s08_structured.bench.testing import accepts, format_checker, sample_strings

FORMAT_CHECKER = format_checker()


def validator(schema):
    """Draft 2020-12's validator; draft 7's for `dependencies` (2020-12 no longer knows it)."""
    cls = jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator
    return cls(schema, format_checker=FORMAT_CHECKER)


FEATURES = {  # name -> schema; every one compiles in strict mode (exactly)
    "number_closed": {"type": "number", "minimum": -2.5, "maximum": 10.125},
    "number_open": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.75},
    "number_min_only": {"type": "number", "minimum": 0.001},
    "number_max_only": {"type": "number", "exclusiveMaximum": -1.5},
    "number_both_kinds": {"type": "number", "minimum": 1, "exclusiveMinimum": 1, "maximum": 3.5,
                          "exclusiveMaximum": 4},
    "typeless_bounds": {"minimum": 0.5, "maximum": 9},
    "email": {"type": "string", "format": "email"},
    "ipv6": {"type": "string", "format": "ipv6"},
    "uri": {"type": "string", "format": "uri"},
    "dependent_required": {"type": "object", "properties": {
        "name": {"type": "string"}, "credit_card": {"type": "integer"}, "billing_address": {"type": "string"}},
        "required": ["name"], "dependentRequired": {"credit_card": ["billing_address"]}},
    "dependencies_draft7": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"}},
        "dependencies": {"a": ["b"], "c": {"properties": {"b": {"minimum": 5}}, "required": ["b"]}}},
    "dependent_schemas": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "t": {"type": "number"}},
                          "dependentSchemas": {"unit": {"required": ["t"]}}},
    "if_then_else": {"type": "object", "properties": {
        "country": {"enum": ["US", "CA", "NL"]}, "zip": {"type": "string"}},
        "required": ["country", "zip"],
        "if": {"properties": {"country": {"const": "US"}}},
        "then": {"properties": {"zip": {"pattern": "^[0-9]{5}$"}}},
        "else": {"properties": {"zip": {"pattern": "^[A-Z0-9]{3,4} ?[A-Z0-9]{2,3}$"}}}},
    "if_type": {"if": {"type": "integer"}, "then": {"minimum": 0, "maximum": 9}, "else": {"type": ["string", "null"]}},
    "if_required": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                    "if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": {"properties": {"b": False}}},
    "pattern_properties": {"type": "object", "properties": {"name": {"type": "string"}},
                           "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
    "pattern_map": {"type": "object",
                    "patternProperties": {"^[a-z]{1,4}$": {"type": "boolean"}, "^_": {"type": "boolean"}}},
    "not_type": {"not": {"type": ["string", "object", "array"]}},
    "not_strings": {"type": "string", "not": {"enum": ["", "none", "null"]}},
    "not_integers": {"type": "integer", "minimum": -3, "maximum": 3, "not": {"enum": [0, 2]}},
    "not_number": {"type": "number", "not": {"const": 1.5}},
    "not_required": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "not": {"required": ["a", "b"]}},
    "not_in_property": {"type": "object", "properties": {"role": {"type": "string", "not": {"const": "root"}}},
                        "required": ["role"]},
}


@cache
def grammar_of(name: str):
    return json_schema_to_grammar(FEATURES[name])


def spec_closed(schema):
    """Strict reading spelled out for jsonschema: objects with properties allow no others."""
    if isinstance(schema, dict):
        out = {k: spec_closed(v) if k in ("properties",) else v for k, v in schema.items()}
        if "properties" in schema:
            out["properties"] = {k: spec_closed(v) for k, v in schema["properties"].items()}
        if "properties" in schema or "patternProperties" in schema:  # both declare, in strict reading
            out.setdefault("additionalProperties", False)
        return out
    return schema


@pytest.mark.parametrize("name", FEATURES)
def test_compiles_exactly_without_warnings(name):
    assert grammar_of(name).warnings == ()


@pytest.mark.parametrize("name", FEATURES)
def test_generated_strings_validate(name):
    check = validator(spec_closed(FEATURES[name]))
    for text in sample_strings(grammar_of(name), random.Random(name), 150):
        value = json.loads(text)
        assert check.is_valid(value), (text, [e.message for e in check.iter_errors(value)])


WORDS = ["US", "CA", "NL", "12345", "1234", "1234 AB", "K1A 0B1", "x", "c", "f", "root", "admin", ""]
OTHER_KEYS = ["name", "a", "b", "x-ab", "x-", "x-A", "abcde", "_z", "Ab"]


def value_like(schema: dict, rng: random.Random):
    """A value of the schema's type (or enum) most of the time, anything else sometimes."""
    kind = schema.get("type")
    if rng.random() < 0.15 or not (kind or "enum" in schema):
        return rng.choice([None, True, 3, -1, 2.5, "x", "root", [], {}])
    if "enum" in schema:
        return rng.choice(schema["enum"] + ["zz"])
    return {"string": lambda: rng.choice(WORDS), "integer": lambda: rng.randint(-2, 8),
            "number": lambda: rng.choice([2.5, 3, -1, 0.25]), "boolean": lambda: rng.random() < 0.5}.get(
        kind, lambda: None)()


def near_values(name: str, rng: random.Random) -> list:
    """Values around the schema: numbers around every bound, format-like strings, objects."""
    schema = FEATURES[name]
    values = [None, True, False, 0, -1, 1, 1.5, "", "x", [], {}, "none", "root"]
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            b = Decimal(repr(schema[key]))
            values += [float(b + d) for d in (Decimal("-0.001"), Decimal("-0.1"), 0, Decimal("0.0001"), 1, -1)]
    values += [round(rng.uniform(-12, 12), rng.randrange(5)) for _ in range(150)]
    values += [rng.randint(-5, 5) for _ in range(20)]
    props = schema.get("properties", {})
    for _ in range(200):  # objects: mostly the declared names with values of about the right type
        keys = list(props) if props and rng.random() < 0.8 else OTHER_KEYS
        values.append({k: value_like(props.get(k, {}), rng) for k in keys if rng.random() < 0.6})
    return values


@pytest.mark.parametrize("name", [n for n in FEATURES if n not in ("email", "ipv6", "uri")])
def test_accepts_exactly_the_valid_values(name):
    schema = FEATURES[name]
    check = validator(spec_closed(schema))
    wrong, verdicts = [], set()
    for value in near_values(name, random.Random(name)):
        text = canonical_instance(value, schema, schema)
        if isinstance(value, float) and "e" in text:
            continue  # exponent spellings: bounded numbers are written without one (documented)
        ours = accepts(grammar_of(name), text)
        verdicts.add(ours)
        if ours != check.is_valid(value):
            wrong.append((text, check.is_valid(value)))
    assert not wrong, wrong[:5]
    assert verdicts == {True, False}, "one-sided sample"


def test_bounded_numbers_are_written_without_exponent_or_leading_zeros():
    g = grammar_of("number_min_only")
    assert accepts(g, "0.001") and accepts(g, "0.0010") and accepts(g, "12") and accepts(g, "0.0011")
    for text in ("1e-3", "1E2", "00.5", "-0.5", ".5", "0.0009999", "+1", "1."):
        assert not accepts(g, text), text
    assert accepts(grammar_of("number_max_only"), "-1.5000001") and not accepts(grammar_of("number_max_only"), "-1.5")


FORMAT_EXAMPLES = {
    "email": (["a@b.co", "first.last+tag@mail.example.org", "x_y@a-b.cd"],
              ["@b.co", "a@.co", "a..b@c.de", "a@b.c", "a b@c.de", "a@-b.co"]),
    "hostname": (["example.com", "a", "x-1.y2.z3"], ["-a.com", "a-.com", "a..b", "Example.com", "a_b.com"]),
    "ipv6": (["::1", "::", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::ffff:192.0.2.1", "fe80::1:2"],
             ["1:2:3:4:5:6:7:8:9", "::1::", "12345::", "::ffff:256.0.0.1", "1:2", ":1"]),
    "uri": (["https://example.com/a/b?q=1#top", "mailto:a@b.co", "urn:isbn:0451450523", "file:///etc/x",
             "http://u:p@h:8080/%20x"], ["example.com", "http://exa mple.com", "1http://x", "http://x/%zz"]),
}


@pytest.mark.parametrize("fmt", FORMAT_EXAMPLES)
def test_format_examples(fmt):
    g = json_schema_to_grammar({"type": "string", "format": fmt}, mode="best-effort")
    good, bad = FORMAT_EXAMPLES[fmt]
    for text in good:
        assert accepts(g, json.dumps(text)), text
    for text in bad:
        assert not accepts(g, json.dumps(text)), text


def test_hostname_is_relaxed_and_says_what():
    with pytest.raises(Exception, match="hostname"):
        json_schema_to_grammar({"type": "string", "format": "hostname"})
    g = json_schema_to_grammar({"type": "string", "format": "hostname"}, mode="best-effort")
    assert [w.feature for w in g.warnings] == ["format"] and "63" in str(g.warnings[0])
    check = validator({"type": "string", "format": "hostname"})
    drawn = [json.loads(t) for t in sample_strings(g, random.Random(1), 200)]
    assert all(check.is_valid(v) for v in drawn if len(v) < 60)  # within the lengths: exact


# ------------------------------------------------------------------ agreement with xgrammar
@cache
def xgrammar_pair(fmt):
    xgr = pytest.importorskip("xgrammar")
    from course.s01_decode_loop.testing import byte_tokenizer

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(byte_tokenizer(), vocab_size=258))
    theirs = compiler.compile_json_schema(json.dumps({"type": "string", "format": fmt}), any_whitespace=False,
                                          strict_mode=True)

    def run(text):
        matcher = xgr.GrammarMatcher(theirs)
        return matcher.accept_string(text) and matcher.is_completed()

    return run


def mutations(text: str, rng: random.Random) -> list[str]:
    """Near misses: a character dropped, doubled or replaced by one that matters to formats."""
    out = []
    for _ in range(6):
        i = rng.randrange(1, max(len(text) - 1, 2))
        c = rng.choice(":.@/-%#?A1 _")
        out += [text[:i] + text[i + 1:], text[:i] + c + text[i:], text[:i] + c + text[i + 1:]]
    return out


@pytest.mark.parametrize("fmt", ["email", "hostname", "ipv6", "uri"])
def test_formats_accept_the_same_strings_as_xgrammar(fmt):
    """Same language as xgrammar's own format grammars, on strings drawn from either side and
    near misses, except where xgrammar writes invalid output (see json_schema/values.py)."""
    theirs = xgrammar_pair(fmt)
    ours = json_schema_to_grammar({"type": "string", "format": fmt}, mode="best-effort")
    rng = random.Random(fmt)
    texts = sample_strings(ours, rng, 80)
    texts += [m for t in texts[:30] for m in mutations(t, rng)]
    texts += [json.dumps(t) for pair in FORMAT_EXAMPLES[fmt] for t in pair]
    differ = [t for t in texts if accepts(ours, t) != theirs(t) and not _xgrammar_invalid(fmt, t)]
    assert not differ, differ[:5]


def _xgrammar_invalid(fmt, text) -> bool:
    """Where xgrammar accepts what the format forbids: an IPv4 octet with a leading zero."""
    return fmt == "ipv6" and bool(re.search(r"(^|[.:])0[0-9]", text.strip('"').split(":")[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["hostname", "uri"])
def test_format_masks_equal_xgrammar(fmt, smollm2_xgrammar, smollm2_info):
    """Token masks at every step of random valid outputs, on the real 49,152-token vocabulary."""
    import numpy as np
    import xgrammar as xgr

    from course.s08_structured.matcher import GrammarMatcher, compile_grammar
    from course.s08_structured.bench.testing import random_valid_path, xgrammar_compile, xgrammar_mask

    schema = {"type": "string", "format": fmt}
    compiled = compile_grammar(json_schema_to_grammar(schema, mode="best-effort"), smollm2_info)
    x_compiled = xgrammar_compile(smollm2_xgrammar, schema, "json_schema")
    special = sorted(smollm2_info.special_ids)
    rng = random.Random(fmt)
    for _ in range(2):
        path = random_valid_path(GrammarMatcher(compiled), rng, max_tokens=30, end_bias=0.3)
        mine, theirs = GrammarMatcher(compiled), xgr.GrammarMatcher(x_compiled)
        for t in path:
            a, b = mine.next_token_mask().copy(), xgrammar_mask(theirs, smollm2_info.vocab_size)
            a[special] = b[special] = False
            assert np.array_equal(a, b), np.flatnonzero(a != b)[:10]
            assert mine.accept_token(t) and theirs.accept_token(t)
