"""Helpers the stage's tests, benchmark and notebook share: the example grammars, whether a
grammar accepts a string, a small vocabulary with multi-byte tokens, random valid token paths,
and xgrammar and llguidance as the outside references."""
from __future__ import annotations

import random
from functools import partial

import numpy as np

from ..automaton import compile_automaton
from ..grammar import Alt, Bytes, CharClass, Grammar, Ref, Seq
from ..matcher import GrammarMatcher
from ..pda import PDA
from ..vocab import TokenizerInfo

EXAMPLE_SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "maxLength": 30},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
        "required": ["name", "age"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "integer"}, "status": {"enum": ["pending", "shipped", "delivered"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["sku", "qty"]}},
        "gift": {"type": "boolean"}, "note": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]}},
        "required": ["id", "status", "items"]},
    "tree": {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer", "minimum": -9, "maximum": 9},
        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}}, "$ref": "#/$defs/node"},
    "event": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 30}, "date": {"type": "string", "format": "date"},
        "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
        "price": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["work", "home", "fun"]},
                                             "maxItems": 3}},
        "required": ["title", "date", "attendees"]},
}

EXAMPLE_REGEXES = {
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "answer": r"(yes|no), because [a-z ,]{5,40}\.",
    "email": r"[a-z][a-z0-9._]{0,15}@[a-z]{2,10}\.(com|org|net)",
    "date": r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
}

EXAMPLE_EBNF = {
    "arithmetic": """
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
""",
    "sql_select": """
root ::= "SELECT " cols " FROM " name where? ";"
cols ::= "*" | name (", " name)*
where ::= " WHERE " name " " op " " value (" AND " name " " op " " value)*
op ::= "=" | "<" | ">" | "<=" | ">=" | "!="
value ::= [0-9]+ | "'" [^'\\n]* "'"
name ::= [a-z_] [a-z0-9_]*
""",
}


def example_grammars() -> dict:
    """name -> a function that builds it: the ten example grammars (schemas, regexes, EBNF)."""
    from ..frontends.ebnf import parse_ebnf
    from ..frontends.regex_parser import regex_to_grammar
    from ..json_schema import json_schema_to_grammar

    return {**{f"schema-{n}": partial(json_schema_to_grammar, s) for n, s in EXAMPLE_SCHEMAS.items()},
            **{f"regex-{n}": partial(regex_to_grammar, p) for n, p in EXAMPLE_REGEXES.items()},
            **{f"ebnf-{n}": partial(parse_ebnf, t) for n, t in EXAMPLE_EBNF.items()}}


def accepts(grammar: Grammar | PDA, text: str | bytes) -> bool:
    """Does the grammar match the whole of `text`? A grammar's automaton is built on its first
    question and kept for the next ones (the last few grammars asked about)."""
    pda = grammar if isinstance(grammar, PDA) else _pda_of(grammar)
    data = text.encode() if isinstance(text, str) else text
    return pda.can_end(pda.walk(pda.start_state(), data))


_PDAS: dict[int, tuple[Grammar, PDA]] = {}   # id(grammar) -> (the grammar, kept alive; its PDA)


def _pda_of(grammar: Grammar) -> PDA:
    hit = _PDAS.get(id(grammar))
    if hit is None:
        if len(_PDAS) >= 64:
            _PDAS.pop(next(iter(_PDAS)))         # the oldest
        hit = _PDAS[id(grammar)] = (grammar, PDA(compile_automaton(grammar)))
    return hit[1]


def synthetic_vocab(seed: int = 0, size: int = 600, texts=("{}[]\":, -0123456789.ab_eé😀truefalsnul",)) -> TokenizerInfo:
    """Every byte as a token, plus random multi-byte pieces of `texts` and random byte strings
    (some ending inside a UTF-8 character), plus a special token and a stop token: small enough
    for the naive reference, varied enough to exercise prefixes, splits and uncertain tokens."""
    rng = random.Random(seed)
    pieces = {bytes([b]) for b in range(256)}
    blob = "".join(texts).encode()
    while len(pieces) < size:
        if rng.random() < 0.7:
            i = rng.randrange(len(blob))
            pieces.add(blob[i:i + rng.randint(2, 8)])
        else:
            pieces.add(bytes(rng.choice(blob) for _ in range(rng.randint(2, 5))))
    token_bytes = sorted(pieces, key=lambda b: (len(b), b))
    rng.shuffle(token_bytes)
    special, stop = len(token_bytes), len(token_bytes) + 1
    return TokenizerInfo(token_bytes + [b"", b""], (stop,), frozenset({special}))


def random_valid_path(matcher: GrammarMatcher, rng: random.Random, max_tokens: int = 60,
                      end_bias: float = 0.3) -> list[int]:
    """Token ids sampled uniformly from the allowed ones at each step (stop tokens with
    probability `end_bias` when allowed), advancing the matcher; returns the ids."""
    ids = []
    stop = set(matcher.compiled.info.stop_ids)
    for _ in range(max_tokens):
        allowed = np.flatnonzero(matcher.next_token_mask())
        if not allowed.size:
            break
        ends = [t for t in allowed.tolist() if t in stop]
        others = [t for t in allowed.tolist() if t not in stop]
        t = rng.choice(ends) if ends and (not others or rng.random() < end_bias) else rng.choice(others)
        assert matcher.accept_token(t)
        ids.append(t)
        if matcher.is_terminated():
            break
    return ids


def xgrammar_compiler(tokenizer, vocab_size: int, cache_enabled: bool = True):
    """xgrammar (PyPI), our outside reference, on the same tokenizer."""
    import xgrammar as xgr

    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size),
                               cache_enabled=cache_enabled)


def xgrammar_compile(compiler, grammar: str | dict, kind: str):
    """The same grammar compiled by xgrammar. kind: 'ebnf' (text), 'regex' or 'json_schema'
    (xgrammar's own converter, compact separators, strict mode)."""
    import json

    if kind == "ebnf":
        return compiler.compile_grammar(grammar)
    if kind == "regex":
        return compiler.compile_regex(grammar)
    return compiler.compile_json_schema(json.dumps(grammar), any_whitespace=False, strict_mode=True)


def xgrammar_mask(matcher, vocab_size: int) -> np.ndarray:
    import xgrammar as xgr

    from ..matcher import unpack_bitmask

    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    return unpack_bitmask(bitmask[0], vocab_size).numpy()


def xgrammar_comparable(schema):
    """The schema minus minLength/maxLength and format, where xgrammar 0.2.8 and JSON differ:
    xgrammar writes a length-bounded string as [^"\\\r\n]{m,n} (no escapes, raw control
    characters allowed, which JSON forbids), and its "date" accepts 31 days in every month;
    ours follow JSON and the calendar. The two are compared on schemas without them."""
    if isinstance(schema, dict):
        return {k: xgrammar_comparable(v) for k, v in schema.items() if k not in ("minLength", "maxLength", "format")}
    if isinstance(schema, list):
        return [xgrammar_comparable(v) for v in schema]
    return schema


class _TooDeep(Exception):
    pass


def sample_strings(grammar: Grammar, rng: random.Random, count: int, max_depth: int = 40) -> list[str]:
    """`count` random strings of the grammar's language (without a tokenizer): alternatives
    picked uniformly, repetitions of geometric length, characters mostly ASCII. A draw that
    recurses past `max_depth` rules is dropped and drawn again."""
    out = []
    while len(out) < count:
        try:
            out.append(_sample(grammar, grammar.rules[grammar.root], rng, 0, max_depth))
        except _TooDeep:
            continue
    return out


def _sample(grammar, e, rng, depth, max_depth) -> str:
    if isinstance(e, Bytes):
        return e.value.decode()
    if isinstance(e, CharClass):
        ascii_ = [(lo, min(hi, 0x7E)) for lo, hi in e.ranges if lo <= 0x7E]
        lo, hi = rng.choice(ascii_ if ascii_ and rng.random() < 0.9 else list(e.ranges))
        return chr(rng.randint(lo, hi))
    if isinstance(e, Ref):
        if depth >= max_depth:
            raise _TooDeep
        return _sample(grammar, grammar.rules[e.name], rng, depth + 1, max_depth)
    if isinstance(e, Seq):
        return "".join(_sample(grammar, it, rng, depth, max_depth) for it in e.items)
    if isinstance(e, Alt):
        return _sample(grammar, rng.choice(e.items), rng, depth, max_depth)
    n = e.min  # a Repeat: geometric length between its bounds
    while (e.max is None or n < e.max) and rng.random() < 0.6:
        n += 1
    return "".join(_sample(grammar, e.item, rng, depth, max_depth) for _ in range(n))


def format_checker():
    """jsonschema's format checker, plus the formats it leaves to optional packages: hostname
    (RFC 1123, as `fqdn` reads it), ipv6 (Python's ipaddress), uri (RFC 3986's characters and
    shape), and email read as "something@something" (what jsonschema checks)."""
    import ipaddress
    import re
    from urllib.parse import urlsplit

    import jsonschema

    checker = jsonschema.FormatChecker()

    @checker.checks("hostname")
    def hostname(text) -> bool:
        label = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
        return len(text) <= 253 and all(re.fullmatch(label, x) for x in text.split("."))

    @checker.checks("ipv6", raises=ValueError)
    def ipv6(text) -> bool:
        return ipaddress.IPv6Address(text) is not None

    @checker.checks("uri", raises=ValueError)
    def uri(text) -> bool:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#%\[\]]*", text):
            return False
        if re.search(r"%(?![0-9A-Fa-f]{2})", text) or text.count("#") > 1:
            return False
        urlsplit(text)  # raises ValueError on a malformed authority
        return True

    @checker.checks("email")
    def email(text) -> bool:
        local, at, domain = text.rpartition("@")
        return bool(at and local and domain)

    return checker


def llguidance_tokenizer(tokenizer, vocab_size: int):
    """llguidance (PyPI), the second outside reference, on the same tokenizer (~1 s: keep it)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)


def llguidance_comparable(schema):
    """The schema with `additionalProperties: false` on every object that does not say: llguidance
    reads JSON Schema's default (any extra property), ours strict mode's (none; `strict=False`
    reads the default too)."""
    if isinstance(schema, dict):
        out = {k: llguidance_comparable(v) for k, v in schema.items()}
        if out.get("type") == "object" and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [llguidance_comparable(v) for v in schema]
    return schema


def llguidance_matcher(tokenizer, grammar: str | dict, kind: str, lenient: bool = False):
    """The same grammar compiled by llguidance: kind 'ebnf' (the same text, through its GBNF
    reader), 'regex' (\\d as [0-9], ours; Rust's \\d is any Unicode digit) or 'json_schema' (its
    own converter with our spelling: ", " and ": ", no other whitespace; `lenient`: keywords it does
    not implement are ignored, as our best-effort mode relaxes them, instead of refused)."""
    import llguidance

    if kind == "ebnf":
        text = llguidance.grammar_from("ebnf", grammar)
    elif kind == "regex":
        text = llguidance.LLMatcher.grammar_from_regex(grammar.replace("\\d", "[0-9]"))
    else:
        text = llguidance.LLMatcher.grammar_from_json_schema(
            grammar, overrides={"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False,
                                "lenient": lenient})
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    if matcher.is_error():
        raise ValueError(matcher.get_error())
    return matcher


def llguidance_mask(matcher, vocab_size: int) -> np.ndarray:
    import torch

    from ..matcher import unpack_bitmask

    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.int32).copy()
    return unpack_bitmask(torch.from_numpy(words), vocab_size).numpy()
