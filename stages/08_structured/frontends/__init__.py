"""Text front ends: EBNF grammars (ebnf.py) and regular expressions (regex_parser.py) -> Grammar."""
