"""Where a grammar comes from. Each front end registers a *source kind*: the flag that selects
it (`--json-schema FILE`, `--regex R`, `--grammar FILE`), its own options, and how the flag's
value becomes a Grammar. The front ends (json_schema/, frontends/) register when imported."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..grammar import Grammar, GrammarError


@dataclass(frozen=True)
class SourceKind:
    flag: str                                                  # "--regex", with its metavar "R"
    metavar: str
    help: str
    load: Callable[[str, argparse.Namespace], Grammar]         # (the flag's value, all options) -> Grammar
    add_options: Callable[[argparse.ArgumentParser], None] | None = None  # the kind's own options


SOURCES: dict[str, SourceKind] = {}   # flag -> kind, in the order they registered


def register_source(kind: SourceKind) -> None:
    SOURCES[kind.flag] = kind


def add_source_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """One flag per registered kind (exactly one, if `required`), then each kind's options."""
    group = parser.add_argument_group("grammar (exactly one)").add_mutually_exclusive_group(required=required)
    for kind in SOURCES.values():
        group.add_argument(kind.flag, metavar=kind.metavar, help=kind.help)
        if kind.add_options is not None:
            kind.add_options(parser)


def grammar_from_args(args: argparse.Namespace) -> Grammar | None:
    """The grammar of the source flag given (None if none was)."""
    for kind in SOURCES.values():
        value = getattr(args, kind.flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            return kind.load(value, args)
    return None


def read_text(path: str | Path, what: str) -> str:
    """A source file's text, or a GrammarError that names the file."""
    p = Path(path)
    if not p.is_file():
        raise GrammarError(f"{what} file not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GrammarError(f"cannot read {what} file {p}: {e}") from None
