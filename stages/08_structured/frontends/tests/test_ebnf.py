"""ebnf.py: the parser builds the grammar the text means, prints back to itself, and reports
errors by line and column."""
import random

import pytest

from course.s08_structured.frontends.ebnf import parse_ebnf, to_ebnf
from course.s08_structured.grammar import (EMPTY, MAX_CODEPOINT, CharClass, Grammar, GrammarError, Ref, alt, chars,
                                           lit, opt, plus, repeat, seq, star)

JSON = r"""
# JSON (RFC 8259), whitespace only where the RFC allows it
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* )
           ( "." [0-9]+ )?                 # a rule continues until the next `name ::=`
           ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
"""

ARITHMETIC = """
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
"""


def accepts(grammar, text):
    from course.s08_structured.bench.testing import accepts

    return accepts(grammar, text)


def matcher(text):
    from course.s08_structured.automaton import compile_automaton
    from course.s08_structured.pda import PDA

    return PDA(compile_automaton(parse_ebnf(text)))


# ---------------------------------------------------------------- what the parser builds
def test_builds_the_expected_trees():
    g = parse_ebnf('root ::= "a" b* | [x-z]+ "" (b | "c"){2,3}\nb ::= [^\\n]?')
    assert g.rules == {
        "root": alt(seq(lit("a"), star(Ref("b"))),
                    seq(plus(chars("x-z")), repeat(alt(Ref("b"), lit("c")), 2, 3))),
        "b": opt(chars("\n", negated=True)),
    }


def test_rules_span_lines_until_the_next_name_followed_by_defines():
    g = parse_ebnf('root ::= "a"\n   b   # still root: a sequence\n'
                   'b ::= "x"\n  | "y" # still b\n\n  c-1\nc-1 ::= ""')
    assert g.rules == {"root": seq(lit("a"), Ref("b")), "b": alt(lit("x"), seq(lit("y"), Ref("c-1"))),
                       "c-1": EMPTY}


def test_string_and_class_escapes():
    g = parse_ebnf(r'''root ::= "\x41\u00e9\U0001F600\n\r\t\"\\\'" [\]\[\-\^\\\x00\u00ff] [a-]''')
    assert g.rules["root"] == seq(lit("A\u00e9\U0001F600\n\r\t\"\\'"),
                                  CharClass.of([(ord(c), ord(c)) for c in "][-^\\\x00\xff"]),
                                  chars("a-", negated=False))
    assert parse_ebnf(r'root ::= [^\x00-\U0010ffff]').rules["root"] == CharClass(())


def test_bounds_and_root_argument():
    g = parse_ebnf('start ::= "a"{3} "b"{2,} "c"{ 0 , 4 } "d"{1} "e"{0}', root="start")
    assert g.root == "start"
    assert g.rules["start"] == seq(repeat(lit("a"), 3, 3), repeat(lit("b"), 2, None), repeat(lit("c"), 0, 4),
                                   lit("d"))


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("text", [JSON, ARITHMETIC], ids=["json", "arithmetic"])
def test_printed_grammar_parses_back_equal(text):
    g = parse_ebnf(text)
    assert parse_ebnf(to_ebnf(g)) == g
    assert to_ebnf(parse_ebnf(to_ebnf(g))) == to_ebnf(g)


NAMES = ["root", "a", "b-2", "_c"]
# characters the printer must escape or encode, in literals and in classes
TRICKY = 'az"\\]^[-\n\r\t\x00\x1f\x7f\x80\u00e9\u2028\ud7ff\ue000\U0001F600\U0010ffff'


def random_expr(rng, depth):
    """A random expression built with the helpers, i.e. in the canonical form the parser builds."""
    if depth == 0 or rng.random() < 0.3:
        kind = rng.randrange(4)
        if kind == 0:
            return lit("".join(rng.choice(TRICKY) for _ in range(rng.randrange(4))))
        if kind == 1:
            los = [rng.choice([rng.randrange(128), rng.randrange(MAX_CODEPOINT + 1)]) for _ in range(rng.randint(1, 3))]
            return CharClass.of([(lo, min(lo + rng.randrange(300), MAX_CODEPOINT)) for lo in los], rng.random() < 0.3)
        if kind == 2:
            return CharClass.of([(ord(c), ord(c)) for c in rng.sample(TRICKY, rng.randint(1, 4))], rng.random() < 0.3)
        return Ref(rng.choice(NAMES))
    kind = rng.randrange(3)
    if kind == 2:
        lo = rng.randrange(4)
        return repeat(random_expr(rng, depth - 1), lo, rng.choice([None, lo, lo + 1, lo + 2]))
    items = [random_expr(rng, depth - 1) for _ in range(rng.randint(2, 3))]
    return seq(*items) if kind == 0 else alt(*items)


def test_any_grammar_built_with_the_helpers_round_trips():
    rng = random.Random(0)
    for _ in range(300):
        g = Grammar({name: random_expr(rng, 4) for name in NAMES}, rng.choice(NAMES))
        assert parse_ebnf(to_ebnf(g), root=g.root) == g, to_ebnf(g)


# ---------------------------------------------------------------- what the grammars accept
JSON_CASES = [
    ('{"a": [1, 2.5e-3, true, null], "b": {"c": "d\\n\\u00e9"}}', True),
    ("  []  ", True), ("[]", True), ("{}", True), ('""', True), ("-0", True), ("0.5", True), ("1E+9", True),
    ('"\u00e9\U0001F600"', True), ('[[[[{"x":[]}]]]]', True),
    ("", False), ("[1,]", False), ("{a: 1}", False), ("01", False), (".5", False), ("1.", False),
    ("tru", False), ('"\\x"', False), ('"a\nb"', False), ("[1 2]", False), ('{"a" 1}', False),
    ("[", False), ("nul", False), ("--1", False), ("1e", False), ("'a'", False),
]


def test_json_grammar_accepts_json_and_rejects_the_rest():
    m = matcher(JSON)
    wrong = [(text, expect) for text, expect in JSON_CASES if accepts(m, text) != expect]
    assert not wrong


ARITHMETIC_CASES = [
    ("1", True), ("1+2*3", True), ("(1+2)*3", True), ("--1", True), ("2.5/0.5", True), ("((((1))))", True),
    ("-(3-4)/-2", True), ("10*20*30-40", True),
    ("", False), ("1+", False), ("(1", False), ("1)", False), ("1..2", False), ("+1", False),
    ("1 + 2", False), (".5", False), ("()", False), ("1(2)", False), ("*", False),
]


def test_arithmetic_grammar():
    m = matcher(ARITHMETIC)
    wrong = [(text, expect) for text, expect in ARITHMETIC_CASES if accepts(m, text) != expect]
    assert not wrong


def test_accepts_takes_a_grammar_directly():
    g = parse_ebnf('root ::= ("ab" | [0-9]{2,3})+')
    assert accepts(g, "ab12ab345") and not accepts(g, "ab1")


# ---------------------------------------------------------------- errors
# (text, what the message must contain)
ERRORS = [
    ('root ::= "a"\nvalue = "x"', "line 2, col 7: expected '::=' after rule name 'value', found '= \"x\"'"),
    ("", "empty grammar"),
    ("  # nothing but a comment\n\n", "empty grammar"),
    ('1x ::= "a"', "line 1, col 1: expected a rule name"),
    ('root ::= "abc\n', "line 1, col 10: unterminated string literal"),
    ('root ::= "abc', "line 1, col 10: unterminated string literal"),
    ('root ::= "a"\n  [abc', "line 2, col 3: unterminated character class"),
    (r'root ::= "a\qb"', "line 1, col 12: bad escape '\\\\q' in string literal"),
    (r'root ::= [\d]', "line 1, col 11: bad escape '\\\\d' in character class"),
    (r'root ::= "\x4"', "line 1, col 11: bad escape in string literal: \\x needs 2 hex digits"),
    (r'root ::= "\U00110000"', "line 1, col 11: bad escape in string literal: 0x110000 is beyond"),
    (r'root ::= "\ud800"', "line 1, col 10: a string literal cannot contain a surrogate"),
    ('root ::= "a"{3,1}', "line 1, col 13: bad repetition bounds {3,1}"),
    ('root ::= "a"{x}', "line 1, col 14: expected a number"),
    ('root ::= "a"{2', "line 1, col 15: expected '}'"),
    ('root ::= "a"*+', "line 1, col 14: a repetition cannot follow another"),
    ('root ::= [z-a]', "line 1, col 11: bad range 'z-a'"),
    ('root ::= []', "line 1, col 10: empty character class"),
    ('root ::= "a"\nroot ::= "b"', "line 2, col 1: rule 'root' is defined twice (first at line 1, col 1)"),
    ('root ::= a\n  b\na ::= "x"', "line 2, col 3: undefined rule 'b'"),
    ('start ::= "a"', "no root rule 'root'"),
    ('root ::= "a" (= "b")', "line 1, col 14: lookahead assertions '(= ...)' are not supported"),
    ('root ::= ("a" "b"\n', "line 2, col 1: expected ')' to close the group opened at line 1, col 10"),
    ('root ::= "a")', "line 1, col 13: unbalanced ')'"),
    ('root ::= "a" | | "b"', "line 1, col 16: expected an expression"),
    ("root ::=\n", "line 2, col 1: expected an expression"),
    ("root ::= ()", "line 1, col 11: expected an expression"),
    ("root ::= 'a'", "line 1, col 10: string literals use double quotes"),
    ('root ::= "a" @ "b"', "line 1, col 14: unexpected '@'"),
]


@pytest.mark.parametrize("text,message", ERRORS, ids=[m.split(":")[-1][:40] for _, m in ERRORS])
def test_errors_say_what_and_where(text, message):
    with pytest.raises(GrammarError) as err:
        parse_ebnf(text)
    assert message in str(err.value)
