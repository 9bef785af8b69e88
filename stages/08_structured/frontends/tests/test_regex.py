"""regex.py: the compiled grammar accepts exactly what Python's re.fullmatch accepts.

Every pattern in CASES is checked against `re` (with re.ASCII, the meaning of \\d \\w \\s we
chose) on random strings over an alphabet picked to hit its edges, and on strings that
hypothesis generates to match it, so both "accepts too little" and "accepts too much" show up.
"""
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.s08_structured.frontends.ebnf import parse_ebnf, to_ebnf
from course.s08_structured.grammar import EMPTY, CharClass, Grammar, GrammarError, alt, chars, lit, repeat, seq
from course.s08_structured.frontends.regex_parser import parse_regex, regex_to_grammar

# (pattern, alphabet for random strings): together they cover every supported construct
CASES = [
    ("abc", "abc"),                                  # literals
    ("a|b|", "ab"),                                  # alternation with an empty alternative
    ("(ab|cd)*e", "abcde"),                          # group, star
    ("x+y?z*", "xyz"),                               # + ? *
    ("a{3}", "ab"),                                  # {m}
    ("a{2,}b", "ab"),                                # {m,}
    ("(?:ab){1,3}", "ab"),                           # non-capturing group, {m,n}
    ("a{0,2}?b+?c*?", "abc"),                        # lazy forms
    ("a??(?:b{2})?", "ab"),                          # lazy ?, {m} inside an optional group
    (r"\d+(\.\d+)?", "01.9a"),                       # \d, escaped metacharacter
    (r"\D\W\S", "a1 _.\t"),                          # negated shorthand classes
    (r"\w+@\w+\.com", "ab1_@.com"),                  # \w
    (r"\s*x", " \t\n\r\f\vx"),                       # \s (ASCII whitespace)
    ("a.c", "abc\n\r"),                              # . excludes only \n
    ("[a-c]+", "abcd"),                              # class with a range
    ("[^a-c]", "abcd\n"),                            # negated class
    (r"[\d\s_-]+", "1 _-a\t"),                       # shorthands and '-' inside a class
    (r"[^\w]", "a_ -1"),                             # negated shorthand inside a negated class
    (r"[\]\[\\^-]+", "][\\^-a"),                     # escapes inside a class
    (r"[a-]|[-z]", "a-z"),                           # '-' at either end of a class is literal
    (r"\x41\u00e9\n\t\0[\b]", "A\u00e9\n\t\0\bx"),   # character escapes ([\b] is backspace)
    (r"\.\*\+\?\(\)\{\}\|\/\\\$\^", ".*+?(){}|/\\$^"),  # escaped metacharacters
    (r"(?P<year>\d{4})-(?<month>\d\d)", "0123-"),    # named groups, both spellings
    ("^(a|b)*$", "ab"),                              # anchors at the very ends
    ("}]", "}]"),                                    # a lone } or ] is a literal
    ("(a|ab)(c|bcd)(d*)", "abcd"),                   # ambiguity the automaton must keep alive
    ("\u00e9+\u00fc?|[\u0100-\u0200]", "\u00e9\u00fca\u0150"),  # non-ASCII: multi-byte UTF-8
    ("()|a*|(a*)*b", "ab"),                          # empty groups, nested stars
]


def python_pattern(pattern: str) -> str:
    """Python 3.11's re has no (?<name>...) spelling: translate it for the oracle."""
    return re.sub(r"\(\?<(?=[A-Za-z_])", "(?P<", pattern)


def fullmatch(pattern: str, text: str) -> bool:
    return re.fullmatch(python_pattern(pattern), text, re.ASCII) is not None


_MATCHERS = {}


def matcher(pattern: str):
    """A pushdown automaton for the pattern, built once (accepts() takes one as well as a Grammar)."""
    if pattern not in _MATCHERS:
        from course.s08_structured.automaton import compile_automaton
        from course.s08_structured.pda import PDA

        _MATCHERS[pattern] = PDA(compile_automaton(regex_to_grammar(pattern)))
    return _MATCHERS[pattern]


def accepts(pattern: str, text: str) -> bool:
    from course.s08_structured.bench.testing import accepts

    return accepts(matcher(pattern), text)


@pytest.mark.parametrize("pattern,alphabet", CASES, ids=[c[0] for c in CASES])
def test_agrees_with_python_re_on_random_strings(pattern, alphabet):
    rng = random.Random(pattern)
    texts = {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(300)}
    disagree = [t for t in sorted(texts) if accepts(pattern, t) != fullmatch(pattern, t)]
    assert not disagree, f"{pattern!r} disagrees with re on {disagree[:5]}"


# Python's backtracking needs exponential time for (a*)*b against a long run of a's; the
# automaton does not (see test_nested_stars_take_linear_time), but the oracle would hang.
GENERATED = [c[0] for c in CASES if "(a*)*" not in c[0]]


@pytest.mark.parametrize("pattern", GENERATED)
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_accepts_strings_generated_from_the_regex(pattern, data):
    # hypothesis intersects every class with ASCII under re.ASCII, so pass the flag only if it matters
    flags = re.ASCII if re.search(r"\\[dwsDWS]", pattern) else 0
    strategy = st.from_regex(re.compile(python_pattern(pattern), flags), fullmatch=True)
    for text in data.draw(st.lists(strategy, min_size=8, max_size=8)):
        assert accepts(pattern, text), (pattern, text)
        # one character more or less must still agree with re (catches over-acceptance)
        for variant in (text + "a", text[:-1], "\n" + text):
            assert accepts(pattern, variant) == fullmatch(pattern, variant), (pattern, variant)


@pytest.mark.parametrize("pattern", [c[0] for c in CASES])
def test_grammar_is_one_rule_that_prints_and_parses_back(pattern):
    grammar = regex_to_grammar(pattern)
    assert list(grammar.rules) == ["root"]
    assert parse_ebnf(to_ebnf(grammar)) == grammar


def test_shapes_of_the_compiled_expressions():
    assert parse_regex("abc") == lit("abc")                              # literals merge
    assert parse_regex("a|") == alt(lit("a"), EMPTY)
    assert parse_regex("") == EMPTY
    assert parse_regex("a*?") == parse_regex("a*") == repeat(lit("a"), 0, None)
    assert parse_regex("a{2,5}?") == repeat(lit("a"), 2, 5)
    assert parse_regex("(?P<n>ab)c") == parse_regex("(?<n>ab)c") == parse_regex("(?:ab)c") == lit("abc")
    assert parse_regex("^a$") == parse_regex("a")
    assert parse_regex("a{1}") == lit("a") and parse_regex("a{0}") == EMPTY
    assert parse_regex(".") == chars("\n", negated=True)
    assert parse_regex(r"\d") == chars("0-9")
    assert parse_regex(r"\w") == chars("a-zA-Z0-9_")
    assert parse_regex(r"\s") == chars(" \t\n\r\f\v")
    assert parse_regex(r"\S") == chars(" \t\n\r\f\v", negated=True)
    assert parse_regex(r"[^\D]") == chars("0-9")                         # double negation
    assert parse_regex("[\ud800-\udfff]") == CharClass(())               # surrogates are no characters
    assert parse_regex(r"a\{1\}") == lit("a{1}")
    assert parse_regex(r"(a|b)c+") == seq(alt(lit("a"), lit("b")), repeat(lit("c"), 1, None))
    assert regex_to_grammar("x") == Grammar({"root": lit("x")})


# (pattern, words the message must contain, position it must report)
ERRORS = [
    (r"(a)\1", "backreference \\1", 3),
    (r"(?P<n>a)(?P=n)", "backreference (?P=name)", 8),
    (r"(?<n>a)\k<n>", "backreference \\k<name>", 7),
    ("a(?=b)", "lookahead", 1),
    ("a(?!b)", "negative lookahead", 1),
    ("(?<=a)b", "lookbehind", 0),
    ("(?<!a)b", "negative lookbehind", 0),
    (r"\bword", "word boundary", 0),
    (r"a\B", "\\B", 1),
    (r"\Aa", "\\A", 0),
    (r"a\Z", "\\Z", 1),
    ("(?i)abc", "inline flags", 0),
    ("(?s:a.)", "inline flags", 0),
    ("a*+", "possessive", 2),
    ("a{2}+", "possessive", 4),
    ("a^b", "'^'", 1),
    ("a$b", "'$'", 1),
    ("(a$)", "'$'", 2),
    ("(ab", "missing ')'", 3),
    ("((a)", "missing ')'", 4),
    ("ab)", "unbalanced ')'", 2),
    ("*a", "nothing to repeat", 0),
    ("a|+", "nothing to repeat", 2),
    ("(?:)?*", "multiple repeat", 5),
    ("a**", "multiple repeat", 2),
    ("[z-a]", "bad character range 'z-a'", 1),
    (r"[\d-z]", "bad character range", 1),
    ("[abc", "unterminated character class", 0),
    ("[]a]", "write \\]", 1),
    ("a{3,1}", "bad repetition bounds {3,1}", 1),
    ("a\\", "trailing backslash", 1),
    (r"\x4", "\\x needs exactly 2 hex digits", 0),
    (r"\u12", "\\u needs exactly 4 hex digits", 0),
    (r"\q", "unsupported escape \\q", 0),
    (r"\p{L}", "Unicode property", 0),
    (r"\01", "octal", 0),
    ("(?P<1>a)", "bad group name", 0),
    ("(?P<a>x)(?P<a>y)", "used twice", 8),
    ("\ud800", "surrogate", 0),
]


@pytest.mark.parametrize("pattern,words,pos", ERRORS, ids=[e[0] for e in ERRORS])
def test_unsupported_or_invalid_patterns_raise_with_construct_and_position(pattern, words, pos):
    with pytest.raises(GrammarError) as err:
        parse_regex(pattern)
    message = str(err.value)
    assert words in message
    assert f"position {pos} " in message and repr(pattern) in message


@pytest.mark.parametrize("pattern", ["a{", "a{x}", "{", "{2}a", "a{,3}", "a{1, 2}", "a{1,2"])
def test_a_brace_must_start_a_quantifier_or_be_escaped(pattern):
    """Our choice: `{` is never silently literal (Python reads 'a{x}' literally, JavaScript-u
    refuses it); write \\{ instead. A lone '}' stays literal, as in both engines."""
    with pytest.raises(GrammarError, match=r"'\{'|nothing to repeat"):
        parse_regex(pattern)
    assert parse_regex(pattern.replace("{", "\\{")) == lit(pattern)
    assert parse_regex("a}") == lit("a}")


def test_nested_stars_take_linear_time():
    assert accepts("()|a*|(a*)*b", "a" * 500 + "b")
    assert not accepts("()|a*|(a*)*b", "a" * 500 + "c")
    assert not accepts("()|a*|(a*)*b", "a" * 500 + "bb")


def test_dot_excludes_only_newline_like_python():
    for ch in ["a", "\r", "\0", "\u2028", "\U0001F600"]:
        assert accepts(".", ch) and fullmatch(".", ch)
    assert not accepts(".", "\n") and not fullmatch(".", "\n")
