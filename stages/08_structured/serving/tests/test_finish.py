"""Answers that finish: serving-mode default bounds (only where the schema has none,
reported, best-effort only) and budget-aware closing (a complete, valid document within a small
max_new_tokens where the plain mask gets cut)."""
import json

import jsonschema
import pytest

from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
from course.s08_structured.realworld import bench_finish
from course.s08_structured.cli import main
from course.s08_structured.serving.bench_planner import distance_by_fixed_point, served_automata
from course.s08_structured.serving.closing import CloseOnBudget, ClosingPlanner, min_accept_distance
from course.s08_structured.frontends.ebnf import to_ebnf
from course.s08_structured.generate import ConstrainedGenerator, GrammarLogitsProcessor
from course.s08_structured.json_schema import SERVING_BOUNDS, DefaultBounds, json_schema_to_grammar
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.pda import PDA
from course.s08_structured.automaton import compile_automaton
from course.s08_structured.grammar import Grammar, Ref, Seq, lit
from course.s08_structured.bench.testing import EXAMPLE_SCHEMAS, accepts
from course.s08_structured.vocab import TokenizerInfo

MIXED = {"type": "object", "properties": {
    "free": {"type": "string"}, "short": {"type": "string", "maxLength": 5},
    "long_min": {"type": "string", "minLength": 3},
    "x": {"type": "number"}, "lim": {"type": "number", "minimum": 0, "maximum": 10},
    "i": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}},
    "few": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3}},
    "required": ["free", "short", "long_min", "x", "lim", "i", "tags", "few"]}
BOUNDS = DefaultBounds(max_string_length=8, max_number_digits=4, max_array_items=3)


def doc(**over):
    base = {"free": "", "short": "abcde", "long_min": "abc", "x": 1.5, "lim": 9.75, "i": -12,
            "tags": [1, 2], "few": [1, 2, 1]}
    return json.dumps({**base, **over})


def test_bounds_apply_only_where_the_schema_has_none_and_are_reported():
    g = json_schema_to_grammar(MIXED, mode="best-effort", default_bounds=BOUNDS)
    got = {(w.feature, w.pointer) for w in g.warnings}
    assert got == {("maxLength", "#/properties/free"), ("maxLength", "#/properties/long_min"),
                   ("maxDigits", "#/properties/x"), ("maxDigits", "#/properties/i"),
                   ("maxItems", "#/properties/tags")}
    assert all(w.kind == "default-bound" for w in g.warnings)
    assert accepts(g, doc())
    assert accepts(g, doc(free="x" * 8, long_min="y" * 8, x=1234.5678, i=-9999, tags=[1, 2, 3]))
    assert not accepts(g, doc(free="x" * 9))            # the default bound holds
    assert not accepts(g, doc(long_min="y" * 9))
    assert not accepts(g, doc(x=12345.5)) and not accepts(g, doc(x=1.23456)) and not accepts(g, doc(i=12345))
    assert not accepts(g, doc(tags=[1, 2, 3, 4]))
    assert not accepts(g, doc(short="abcdef")) and not accepts(g, doc(few=[1, 1, 1, 1]))  # the schema's own
    assert accepts(g, doc(lim=9.123456789))              # bounded numbers are the schema's, untouched
    # listed values are not bounded (nor reported), nor strings that `not` rules out
    g = json_schema_to_grammar({"type": "string", "enum": ["x" * 20, "y"]}, mode="best-effort", default_bounds=BOUNDS)
    assert g.warnings == () and accepts(g, json.dumps("x" * 20))
    g = json_schema_to_grammar({"type": "string", "not": {"const": "no"}}, mode="best-effort", default_bounds=BOUNDS)
    assert g.warnings == () and not accepts(g, '"no"') and accepts(g, json.dumps("z" * 20))
    # a default below the schema's own minimum is raised to it
    g = json_schema_to_grammar({"type": "string", "minLength": 12}, mode="best-effort", default_bounds=BOUNDS)
    assert accepts(g, json.dumps("z" * 12)) and not accepts(g, json.dumps("z" * 13))


def test_strict_mode_and_no_bounds_are_unchanged():
    for name, schema in [*EXAMPLE_SCHEMAS.items(), ("mixed", MIXED)]:
        plain = json_schema_to_grammar(schema, mode="strict")
        bounded = json_schema_to_grammar(schema, mode="strict", default_bounds=SERVING_BOUNDS)
        assert to_ebnf(bounded) == to_ebnf(plain) and bounded.warnings == plain.warnings == (), name
        best = json_schema_to_grammar(schema, mode="best-effort")
        assert to_ebnf(json_schema_to_grammar(schema, mode="best-effort", default_bounds=DefaultBounds())) \
            == to_ebnf(best), name
    assert accepts(json_schema_to_grammar(MIXED, mode="strict", default_bounds=BOUNDS), doc(free="x" * 500))


def test_default_bounds_parse():
    assert DefaultBounds.parse("serving") == SERVING_BOUNDS
    assert DefaultBounds.parse("string=10,items=2") == DefaultBounds(max_string_length=10, max_array_items=2)
    for bad in ("string=0", "strings=3", "digits=x"):
        with pytest.raises(ValueError):
            DefaultBounds.parse(bad)


def test_min_accept_distance_is_the_shortest_completion():
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"},
                                               "b": {"type": "array", "items": {"type": "string"}}},
              "required": ["a", "n"]}
    pda = PDA(compile_automaton(json_schema_to_grammar(schema)))
    planner = ClosingPlanner(pda)
    shortest = '{"a": "", "n": 0}'
    s = pda.start_state()
    assert planner.state_distance(s) == len(shortest)
    for prefix, rest in [('{"a": "hello', '", "n": 0}'), ('{"a": "x", "n": 12', "}"),
                         ('{"a": "x", "n": 1, "b": ["q', '"]}'), ('{"a": "x", "n": 1, "b": ["q"]', "}"),
                         ('{"a": "x", "n": 1}', "")]:
        sid = pda.walk(s, prefix.encode())
        assert planner.state_distance(sid) == len(rest), prefix
        assert pda.can_end(pda.walk(sid, rest.encode()))
    # a rule's start distance is its shortest sentence, recursion included
    tree = json_schema_to_grammar(EXAMPLE_SCHEMAS["tree"])
    auto = compile_automaton(tree)
    assert min(min_accept_distance(auto)) == 0


def test_min_accept_distance_in_knuths_order_equals_the_fixed_point():
    """Settling positions nearest first (a heap) gives the fixed point's distances, on the example
    grammars (recursion, calls), the real-world schemas with the server's default bounds, and a
    grammar with an unreachable end (INF)."""
    for auto in [compile_automaton(json_schema_to_grammar(s)) for s in EXAMPLE_SCHEMAS.values()] + \
            list(served_automata().values()):
        assert min_accept_distance(auto) == distance_by_fixed_point(auto)
    loop = compile_automaton(Grammar({"root": Seq((lit("a"), Ref("root")))}, "root"))  # never ends
    assert min_accept_distance(loop) == distance_by_fixed_point(loop)
    assert min_accept_distance(loop)[loop.root_start] == float("inf")


def test_bench_planner_compares_both_ways_on_every_served_schema(capsys):
    from course.s08_structured.serving.bench_planner import main

    main()
    out = capsys.readouterr().out
    assert out.count(" positions ") == len(bench_finish.example_and_realworld_schemas()) and "x\n" in out


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_model("gqa_tied", seed=0)
    info = TokenizerInfo.from_huggingface(tok, model.config.vocab_size, stop_ids=[tok.eos_token_id])
    return model, tok, info


UNBOUNDED = {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"},
                                              "labels": {"type": "array", "items": {"type": "string"}}},
             "required": ["title", "body", "labels"]}


def _generate(tiny, grammar, max_new_tokens, **gen):
    model, tok, info = tiny
    compiled = compile_grammar(grammar, info)
    out = run_to_end(ConstrainedGenerator(compiled, **gen), model, tok, tok("JSON:").input_ids,
                     SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0), [tok.eos_token_id])
    return out


@pytest.mark.parametrize("max_new_tokens", [48, 80])
def test_closing_finishes_where_the_plain_mask_is_cut(tiny, max_new_tokens):
    grammar = json_schema_to_grammar(UNBOUNDED, mode="best-effort")   # strings unbounded
    cut = _generate(tiny, grammar, max_new_tokens)
    assert cut.finish_reason == "length" and len(cut.token_ids) == max_new_tokens
    with pytest.raises(ValueError):
        json.loads(cut.text)
    closed = _generate(tiny, grammar, max_new_tokens, narrow=CloseOnBudget())
    # a valid document that ends with the stop token, but shorter than the model would write:
    # the answer says it was cut ("length"), so no client takes it for the model's whole answer
    assert closed.finish_reason == "length" and len(closed.token_ids) <= max_new_tokens
    assert closed.token_ids[-1] == tiny[1].eos_token_id
    jsonschema.validate(json.loads(closed.text), UNBOUNDED)
    # before the window opens (41 tokens to close, each byte a token here, + the stop token + a
    # margin of 16) the tokens are the plain mask's (greedy): closing only changes the end
    same = max(0, max_new_tokens - 41 - 1 - 16)
    assert closed.token_ids[:same] == cut.token_ids[:same]


def test_closing_with_the_smallest_possible_budget(tiny):
    grammar = json_schema_to_grammar(UNBOUNDED, mode="best-effort")
    need = len('{"title": "", "body": "", "labels": []}') + 1   # bytes, one token each, and the stop token
    out = _generate(tiny, grammar, need, narrow=CloseOnBudget(margin=0))
    assert out.finish_reason == "length" and out.token_ids[-1] == tiny[1].eos_token_id
    assert json.loads(out.text) == {"title": "", "body": "", "labels": []}
    short = _generate(tiny, grammar, need - 1, narrow=CloseOnBudget())   # impossible: told truthfully
    assert short.finish_reason == "length" and short.token_ids[-1] != tiny[1].eos_token_id


def test_strict_grammar_closes_on_budget_too_and_its_language_is_unchanged(tiny):
    grammar = json_schema_to_grammar(UNBOUNDED, mode="strict", default_bounds=SERVING_BOUNDS)
    assert to_ebnf(grammar) == to_ebnf(json_schema_to_grammar(UNBOUNDED, mode="strict"))
    out = _generate(tiny, grammar, 48, narrow=CloseOnBudget())
    assert out.finish_reason == "length" and out.token_ids[-1] == tiny[1].eos_token_id
    jsonschema.validate(json.loads(out.text), UNBOUNDED)


@pytest.mark.parametrize("name", sorted(set(EXAMPLE_SCHEMAS) - {"tree"}))  # no bound stops a tree nesting
def test_an_answer_that_fits_is_never_changed_and_a_cut_one_says_length(tiny, name):
    """For every budget: if the model's own answer (no budget) fits, closing leaves it exactly as
    it is, finish_reason "stop"; if it does not, the answer ends "length" (closed and valid, or
    cut where no closing fits)."""
    schema = EXAMPLE_SCHEMAS[name]
    grammar = json_schema_to_grammar(schema, mode="best-effort", default_bounds=BOUNDS)
    natural = _generate(tiny, grammar, 400)
    assert natural.finish_reason == "stop", name   # the bounds let the model finish on its own
    n = len(natural.token_ids)
    for budget in sorted({n + 7, n, n - 1, n - 5, (2 * n) // 3, n // 2, 12}):
        out = _generate(tiny, grammar, budget, narrow=CloseOnBudget())
        if budget >= n:
            assert out.token_ids == natural.token_ids and out.finish_reason == "stop", (name, budget)
        else:
            assert out.finish_reason == "length", (name, budget)
            if out.token_ids[-1] == tiny[1].eos_token_id:   # closed: a valid document
                jsonschema.validate(json.loads(out.text), schema)


def test_token_distance_counts_this_tokenizers_tokens(smollm2_info):
    """With a real BPE vocabulary a state's distance in tokens is the closing string cut into
    real tokens: a few bytes per token, never more than the bytes, the state after the first
    token one closer, and walking the whole closing string ends the document."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                               "days": {"type": "integer"}}, "required": ["city", "unit", "days"]}
    compiled = compile_grammar(json_schema_to_grammar(schema), smollm2_info, precompute=False)
    planner = ClosingPlanner(compiled.pda, smollm2_info)
    pda, token_bytes = compiled.pda, smollm2_info.token_bytes
    s = pda.start_state()
    assert planner.state_distance(s) == len('{"city": "", "unit": "celsius", "days": 0}')
    for prefix in ['', '{"city": "Par', '{"city": "Paris", "unit": "fahr', '{"city": "Paris", "unit": "celsius", "days": 1',
                   '{"city": "Paris", "unit": "celsius", "days": 12}']:
        sid = pda.walk(s, prefix.encode())
        d_bytes, d_tokens = planner.state_distance(sid), planner.token_distance(sid)
        assert d_tokens <= d_bytes, prefix
        text, state, tokens = b"", sid, 0
        while planner.state_distance(state) > 0:   # the closing string, a byte at a time
            b, state = planner.next_byte(state)
            text += bytes([b])
        assert len(text) == d_bytes and pda.can_end(state), prefix
        state = sid
        while planner.token_distance(state) > 0:   # and in tokens: the longest token that starts it
            first = max((t for t in range(len(token_bytes)) if token_bytes[t] and text.startswith(token_bytes[t])
                         and t not in smollm2_info.special_ids), key=lambda t: len(token_bytes[t]))
            before = planner.token_distance(state)
            state = pda.walk(state, token_bytes[first])
            text = text[len(token_bytes[first]):]
            assert planner.token_distance(state) == before - 1, prefix
            tokens += 1
        assert tokens == d_tokens and text == b"" and pda.can_end(state), prefix
    # the whole empty document: 42 bytes, far fewer tokens
    assert planner.token_distance(s) <= planner.state_distance(s) // 2


def test_closing_counts_tokens_or_bytes_and_nothing_else():
    assert CloseOnBudget().unit == "tokens" and CloseOnBudget(unit="bytes").unit == "bytes"
    with pytest.raises(ValueError, match="unit"):
        CloseOnBudget(unit="characters")


def test_processor_without_a_budget_is_the_plain_mask(tiny):
    model, tok, info = tiny
    compiled = compile_grammar(json_schema_to_grammar(UNBOUNDED), info)
    a = GrammarLogitsProcessor(compiled, narrow=CloseOnBudget())         # no max_new_tokens: nothing to do
    b = GrammarLogitsProcessor(compiled)
    ids = list(b'{"title": "ab')
    a.prepare(ids)
    b.prepare(ids)
    assert (a.bitmask == b.bitmask).all() and a.narrowed_steps == 0


def test_cli_default_bounds_and_close_on_budget(tiny_folder, capsys):
    schema = json.dumps(UNBOUNDED)
    assert main(["--model", str(tiny_folder), "--json-schema", schema, "--prompt", "JSON:",
                 "--max-new-tokens", "48", "--json", "--default-bounds", "string=6,items=2",
                 "--close-on-budget"]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out)
    assert row["finish_reason"] == "stop"
    value = json.loads(row["text"])
    jsonschema.validate(value, UNBOUNDED)
    assert len(value["title"]) <= 6 and len(value["labels"]) <= 2
    assert "maxLength" in captured.err and "serving default" in captured.err
    with pytest.raises(SystemExit) as e:  # a malformed bound is a usage error, before the model loads
        main(["--model", str(tiny_folder), "--json-schema", schema, "--default-bounds", "strings=3", "--prompt", "x"])
    assert e.value.code == 2


def test_bench_finish_quick(capsys):
    assert bench_finish.main(["--quick", "--compare"])["results"]
    out = capsys.readouterr().out
    assert "serving (bounds + closing): 2/2 valid & complete" in out


@pytest.mark.slow
def test_real_model_closes_a_long_string_schema(smollm2):
    schemas = bench_finish.load_schemas(["send_email"])
    plain = bench_finish.run_schemas(smollm2, schemas, 64, None, False)
    closed = bench_finish.run_schemas(smollm2, schemas, 64, None, True)
    assert plain[0]["verdict"] == "length"
    assert closed[0]["verdict"] == "closed" and closed[0]["finish_reason"] == "length"
