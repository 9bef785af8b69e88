"""`python -m course.s08_structured --json-schema FILE | --regex R | --grammar FILE ...`:
stage 01's CLI contract, with every output kept inside the grammar. The grammar is parsed
before the model loads, so a malformed one fails at once (exit 2, message on stderr).
`--json` adds `stats`: the compile time and the median / p99 mask time per token, and
`warnings`: what `--mode best-effort` (the default) did not enforce, also printed on stderr."""
from __future__ import annotations

import argparse
import sys

from course.s01_decode_loop.cli import main as stage_main

from .generate import ConstrainedGenerator
from .grammar import Grammar, GrammarError
from .json_schema.defaults import DefaultBounds
from .json_schema.modes import BEST_EFFORT, MODES
from .matcher import compile_grammar
from .sources import grammar_from_ebnf_file, grammar_from_json_schema, grammar_from_regex
from .vocab import TokenizerInfo


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("grammar (exactly one)").add_mutually_exclusive_group(required=True)
    g.add_argument("--json-schema", metavar="FILE", help="a JSON Schema file (or the schema as JSON text)")
    g.add_argument("--regex", metavar="R", help="a regular expression the whole output must match")
    g.add_argument("--grammar", metavar="FILE", help="an EBNF grammar file (xgrammar / GBNF dialect, root rule 'root')")
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
    parser.add_argument("--close-on-budget", action="store_true",
                        help="when the tokens left are about what closing the output takes, allow only "
                             "tokens that still let it close before --max-new-tokens")


def _bounds(text: str) -> DefaultBounds:
    try:
        return DefaultBounds.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_grammar(args: argparse.Namespace) -> Grammar:
    if args.json_schema is not None:
        return grammar_from_json_schema(args.json_schema, strict=not args.no_strict, mode=args.mode,
                                        default_bounds=args.default_bounds)
    if args.regex is not None:
        return grammar_from_regex(args.regex)
    return grammar_from_ebnf_file(args.grammar)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_args(early)
    known, _ = early.parse_known_args(argv)
    try:
        # With no grammar flag, stage_main's parser below reports the missing one.
        given = any(v is not None for v in (known.json_schema, known.regex, known.grammar))
        grammar = load_grammar(known) if given else None
    except GrammarError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in grammar.warnings if grammar is not None else ():
        print(f"warning: {warning}", file=sys.stderr)  # relaxed, not silently looser

    def make_stream(loaded, args) -> ConstrainedGenerator:
        info = TokenizerInfo.from_huggingface(loaded.tokenizer, loaded.config.vocab_size,
                                              stop_ids=loaded.eos_token_ids)
        return ConstrainedGenerator(compile_grammar(grammar, info), close_on_budget=args.close_on_budget)

    return stage_main(argv, description="Stage 08: generation constrained by a JSON schema, a regex or a grammar.",
                      make_stream=make_stream, add_args=add_args)
