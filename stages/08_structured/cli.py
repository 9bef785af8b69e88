"""`python -m course.s08_structured --json-schema FILE | --regex R | --grammar FILE ...`:
stage 01's CLI contract, with every output kept inside the grammar. The grammar is parsed
before the model loads, so a malformed one fails at once (exit 2, message on stderr).
`--json` adds `stats`: the compile time and the median / p99 mask time per token, and
`warnings`: what `--mode best-effort` (the default) did not enforce, also printed on stderr.
The rooms plug in here: the front ends register their grammar sources (frontends/sources.py) when
imported, and `--close-on-budget` gives the processor serving/'s CloseOnBudget as `narrow`."""
from __future__ import annotations

import argparse
import sys

from course.s01_decode_loop.cli import main as stage_main

from . import frontends, json_schema  # noqa: F401  (each registers its grammar sources)
from .generate import ConstrainedGenerator
from .grammar import GrammarError
from .matcher import compile_grammar
from .serving.closing import CloseOnBudget
from .frontends.sources import add_source_args, grammar_from_args
from .vocab import TokenizerInfo


def add_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    add_source_args(parser, required)
    parser.add_argument("--close-on-budget", action="store_true",
                        help="when the tokens left are about what closing the output takes, allow only "
                             "tokens that still let it close before --max-new-tokens")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_args(early, required=False)   # no grammar flag (or --help): stage_main's parser answers
    known, _ = early.parse_known_args(argv)
    try:
        grammar = grammar_from_args(known)
    except GrammarError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in grammar.warnings if grammar is not None else ():
        print(f"warning: {warning}", file=sys.stderr)  # relaxed, not silently looser

    def make_stream(loaded, args) -> ConstrainedGenerator:
        info = TokenizerInfo.from_huggingface(loaded.tokenizer, loaded.config.vocab_size,
                                              stop_ids=loaded.eos_token_ids)
        return ConstrainedGenerator(compile_grammar(grammar, info),
                                    narrow=CloseOnBudget() if args.close_on_budget else None)

    return stage_main(argv, description="Stage 08: generation constrained by a JSON schema, a regex or a grammar.",
                      make_stream=make_stream, add_args=add_args)
