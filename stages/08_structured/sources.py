"""Where a grammar comes from: `--json-schema FILE | --regex R | --grammar FILE` -> Grammar."""
from __future__ import annotations

import json
from pathlib import Path

from .grammar import Grammar, GrammarError


def grammar_from_json_schema(source: str | Path, strict: bool = True, mode: str = "strict",
                             default_bounds=None) -> Grammar:
    """A schema file, or the schema itself as JSON text. `mode`: "strict" or "best-effort"
    (json_schema/modes.py); what best-effort relaxed is in the grammar's `warnings`.
    `default_bounds`: a DefaultBounds (json_schema/defaults.py), best-effort only."""
    from .json_schema import json_schema_to_grammar

    text = str(source)
    if not text.lstrip().startswith(("{", "[", "true", "false")):
        text = _read(source, "JSON schema")
    try:
        schema = json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to read
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    return json_schema_to_grammar(schema, strict=strict, mode=mode, default_bounds=default_bounds)


def grammar_from_regex(pattern: str) -> Grammar:
    from .frontends.regex_parser import regex_to_grammar

    return regex_to_grammar(pattern)


def grammar_from_ebnf_file(path: str | Path) -> Grammar:
    from .frontends.ebnf import parse_ebnf

    return parse_ebnf(_read(path, "grammar"))


def _read(path: str | Path, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise GrammarError(f"{what} file not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GrammarError(f"cannot read {what} file {p}: {e}") from None
