"""The JSON Schema front end as a grammar source (frontends/sources.py): `--json-schema FILE`
(or the schema itself as JSON text) and the options that say how to read it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..grammar import Grammar, GrammarError
from ..frontends.sources import SourceKind, read_text, register_source
from .convert import json_schema_to_grammar
from .defaults import DefaultBounds
from .modes import BEST_EFFORT, MODES, STRICT


def grammar_from_json_schema(source: str | Path, strict: bool = True, mode: str = STRICT,
                             default_bounds: DefaultBounds | None = None) -> Grammar:
    """A schema file, or the schema itself as JSON text. `mode`: "strict" or "best-effort"
    (modes.py); what best-effort relaxed is in the grammar's `warnings`. `default_bounds`
    (defaults.py): best-effort only."""
    text = str(source)
    if not text.lstrip().startswith(("{", "[", "true", "false")):
        text = read_text(source, "JSON schema")
    try:
        schema = json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to read
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    return json_schema_to_grammar(schema, strict=strict, mode=mode, default_bounds=default_bounds)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-strict", action="store_true",
                        help="read the schema as the JSON Schema spec does: extra properties allowed, "
                             "format only an annotation (default: strict, like xgrammar)")
    parser.add_argument("--mode", choices=MODES, default=BEST_EFFORT,
                        help="what to do with schema keywords that cannot be enforced exactly: refuse the "
                             "schema (strict) or relax them and report each as a warning (best-effort, default)")
    parser.add_argument("--default-bounds", metavar="SPEC", type=_bounds,
                        help="best-effort only: bounds for what the schema leaves unbounded, e.g. "
                             "'string=64,digits=16,items=16', or 'serving' (those values); each applied is "
                             "reported as a warning. Strict mode ignores it")


def _bounds(text: str) -> DefaultBounds:
    try:
        return DefaultBounds.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


register_source(SourceKind(
    "--json-schema", "FILE", "a JSON Schema file (or the schema as JSON text)",
    lambda value, args: grammar_from_json_schema(value, strict=not args.no_strict, mode=args.mode,
                                                 default_bounds=args.default_bounds),
    add_options))
