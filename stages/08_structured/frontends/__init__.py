"""Text front ends: EBNF grammars (ebnf.py, which also prints any grammar in EBNF) and regular
expressions (regex_parser.py) -> Grammar, registered as the grammar sources `--grammar FILE`
and `--regex R` in sources.py, the registry the CLI reads. (Absolute imports: pytest imports
this file on its own when it collects the tests below it.)"""
from pathlib import Path

from course.s08_structured.frontends.ebnf import parse_ebnf, to_ebnf
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.grammar import Grammar
from course.s08_structured.frontends.sources import SourceKind, read_text, register_source

__all__ = ["grammar_from_ebnf_file", "parse_ebnf", "regex_to_grammar", "to_ebnf"]


def grammar_from_ebnf_file(path: str | Path) -> Grammar:
    return parse_ebnf(read_text(path, "grammar"))


register_source(SourceKind("--regex", "R", "a regular expression the whole output must match",
                           lambda value, args: regex_to_grammar(value)))
register_source(SourceKind("--grammar", "FILE", "an EBNF grammar file (xgrammar / GBNF dialect, root rule 'root')",
                           lambda value, args: grammar_from_ebnf_file(value)))
