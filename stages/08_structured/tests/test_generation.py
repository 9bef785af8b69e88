"""Generation under a grammar: real-model outputs always parse and validate; a grammar that
allows everything changes nothing; the CLI follows the stage contract."""
import json
import re

import jsonschema
import torch
import pytest

from course.s01_decode_loop.generate import encode_prompt, run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s02_kv_cache.generate import stream_cached
from course.s08_structured.bench.testing import EXAMPLE_REGEXES, EXAMPLE_SCHEMAS, accepts
from course.s08_structured.cli import main
from course.s08_structured.frontends import grammar_from_ebnf_file, regex_to_grammar
from course.s08_structured.generate import ConstrainedGenerator
from course.s08_structured.grammar import CharClass, Grammar, star
from course.s08_structured.json_schema import grammar_from_json_schema, json_schema_to_grammar
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.vocab import TokenizerInfo

PROMPTS = {"person": "Describe a fictional person as JSON.", "order": "Write an online shop order as JSON.",
           "event": "Describe a team meeting as JSON."}
# Not "tree": a recursive schema has no depth bound, and the model may nest until max_new_tokens
# runs out ("length"), which is a valid prefix but not a complete value.
SAMPLING = [dict(temperature=0.0), dict(temperature=1.0, seed=1)]   # greedy, and sampled


@pytest.fixture(scope="module")
def compile_for(smollm2):
    """Compile for the real model: its vocabulary read once (and its byte matrix, kept on it)."""
    info = TokenizerInfo.from_huggingface(smollm2.tokenizer, smollm2.config.vocab_size,
                                          stop_ids=smollm2.eos_token_ids)
    return lambda grammar: compile_grammar(grammar, info)


def generate(loaded, compiled, prompt, **params):
    """One request; the compiled grammar is shared between requests, as an engine caches it."""
    ids = encode_prompt(loaded.tokenizer, prompt, chat=True)
    return run_to_end(ConstrainedGenerator(compiled), loaded.model, loaded.tokenizer, ids,
                      SamplingParams(max_new_tokens=160, **params), loaded.eos_token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_real_model_json_always_validates(name, smollm2, compile_for):
    schema = EXAMPLE_SCHEMAS[name]
    compiled = compile_for(json_schema_to_grammar(schema))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for params in SAMPLING:
        out = generate(smollm2, compiled, PROMPTS[name], **params)
        assert out.finish_reason == "stop", (params, out.text)
        validator.validate(json.loads(out.text))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["phone", "email", "date"])
def test_real_model_regex_outputs_match(name, smollm2, compile_for):
    compiled = compile_for(regex_to_grammar(EXAMPLE_REGEXES[name]))
    for params in SAMPLING:
        out = generate(smollm2, compiled, f"Give me an example {name}.", **params)
        assert out.finish_reason == "stop" and re.fullmatch(EXAMPLE_REGEXES[name], out.text), out.text


@pytest.mark.slow
def test_a_grammar_that_allows_everything_changes_nothing(smollm2, compile_for):
    anything = Grammar({"root": star(CharClass.of([(0, 0x10FFFF)]))})
    prompt = "Give me three tips for staying healthy."
    ids = encode_prompt(smollm2.tokenizer, prompt, chat=True)
    params = SamplingParams(max_new_tokens=48, temperature=0.0)
    free = run_to_end(stream_cached, smollm2.model, smollm2.tokenizer, ids, params, smollm2.eos_token_ids)
    constrained = run_to_end(ConstrainedGenerator(compile_for(anything)), smollm2.model,
                             smollm2.tokenizer, ids, params, smollm2.eos_token_ids)
    assert constrained.token_ids == free.token_ids and len(free.token_ids) == 48


def test_cli_output_matches_the_regex(tiny_folder, capsys):
    for seed in (0, 1):
        assert main(["--model", str(tiny_folder), "--regex", "[0-9]{3}-[a-c]+", "--prompt", "hi",
                     "--temperature", "1", "--seed", str(seed), "--max-new-tokens", "20", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert re.fullmatch("[0-9]{3}-[a-c]+", row["text"]) or row["finish_reason"] == "length"
        assert accepts(regex_to_grammar("[0-9]{3}-[a-c]+"), row["text"])
        assert row["stats"]["mask_steps"] == row["num_generated_tokens"]


def test_cli_json_schema_file_and_grammar_file(tiny_folder, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    assert main(["--model", str(tiny_folder), "--json-schema", str(schema), "--prompt", "x", "--json",
                 "--max-new-tokens", "30"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert json.loads(row["text"]) in ({"ok": True}, {"ok": False}) and row["finish_reason"] == "stop"
    ebnf = tmp_path / "g.ebnf"
    ebnf.write_text('root ::= "a" [xy]{2} "!"\n')
    assert main(["--model", str(tiny_folder), "--grammar", str(ebnf), "--prompt", "x", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert re.fullmatch("a[xy]{2}!", row["text"]) and row["finish_reason"] == "stop"


def test_the_readme_commands_run_with_the_committed_example_files(tiny_folder, capsys):
    """The README's first commands, on a tiny model: their files are in the repo, and the output
    is what each grammar allows."""
    from pathlib import Path

    stage = Path(__file__).resolve().parents[1]
    commands = [line.split("python -m course.s08_structured ", 1)[1] for line in (stage / "README.md").read_text().split("\n")
                if line.startswith("python -m course.s08_structured --")]
    files = [w for c in commands for w in c.split() if w.startswith("stages/08_structured/examples/")]
    assert len(files) == 2 and all((stage.parents[1] / f).is_file() for f in files)
    schema, ebnf = (stage.parents[1] / f for f in files)
    for flag, path in (("--json-schema", schema), ("--grammar", ebnf)):
        assert main(["--model", str(tiny_folder), flag, str(path), "--prompt", "x", "--json", "--max-new-tokens", "200",
                     "--temperature", "1", "--seed", "0"]) == 0
        row = json.loads(capsys.readouterr().out)
        grammar = grammar_from_json_schema(str(path)) if flag == "--json-schema" else grammar_from_ebnf_file(path)
        assert accepts(grammar, row["text"]) or row["finish_reason"] == "length"
        if flag == "--json-schema" and row["finish_reason"] == "stop":
            jsonschema.validate(json.loads(row["text"]), json.loads(path.read_text()))


@pytest.mark.parametrize("args,message", [
    (["--regex", "(ab"], "regex"),
    (["--json-schema", "/no/such/schema.json"], "not found"),
    (["--json-schema", '{"type": "object", "uniqueItems": true, "x": '], "not valid JSON"),
    (["--json-schema", '{"type": "array", "uniqueItems": true}', "--mode", "strict"], "uniqueItems"),
])
def test_cli_refuses_bad_grammars_before_loading_the_model(args, message, capsys):
    assert main(args + ["--model", "/no/such/model", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err


def test_cli_best_effort_reports_what_it_relaxed(tiny_folder, capsys):
    """The default mode compiles a schema with uniqueItems and says, on stderr and in --json's
    stats, that items may repeat; strict mode refuses it (above)."""
    schema = '{"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": true, "maxItems": 3, "x-note": 1}'
    assert main(["--model", str(tiny_folder), "--json-schema", schema, "--prompt", "x", "--json",
                 "--max-new-tokens", "20"]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out)
    assert [w["keyword"] for w in row["stats"]["warnings"]] == ["x-note", "uniqueItems"]
    assert "warning: 'uniqueItems' at # is not enforced" in captured.err
    assert set(json.loads(row["text"])) <= {1, 2} or row["finish_reason"] == "length"


def test_cli_needs_exactly_one_grammar(tiny_folder, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tiny_folder), "--prompt", "x"])
    assert e.value.code == 2 and "one of the arguments" in capsys.readouterr().err


def test_the_logits_processor_equals_the_constrained_loop(byte_tok):
    """The processor in stage 04's batched engine gives, request by request, the same tokens as
    ConstrainedGenerator, which runs it in stage 02's loop (greedy and seeded sampling); and
    attaching it by hand to stage 02's loop is the same as ConstrainedGenerator."""
    from course.s01_decode_loop.testing import tiny_model
    from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
    from course.s08_structured.generate import GrammarLogitsProcessor

    model = tiny_model("qwen3")   # any model: the processor only sees its logits
    compiled = compile_grammar(regex_to_grammar(r"\[[0-9]{1,3}(, [a-z]{1,4}){0,3}\]"),
                               TokenizerInfo.from_huggingface(byte_tok, stop_ids=[byte_tok.eos_token_id]))
    prompts = [byte_tok(p).input_ids for p in ("list: ", "Another prompt, longer than the first one: ", "x")]
    settings = [dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=20, seed=4)]
    eos = [byte_tok.eos_token_id]
    expected = [run_to_end(ConstrainedGenerator(compiled), model, byte_tok, ids, SamplingParams(max_new_tokens=24, **s),
                           eos).token_ids for ids, s in zip(prompts, settings)]
    with_processor = lambda s: SamplingParams(max_new_tokens=24, logits_processors=[GrammarLogitsProcessor(compiled)], **s)  # noqa: E731
    plain = [run_to_end(stream_cached, model, byte_tok, ids, with_processor(s), eos).token_ids
             for ids, s in zip(prompts, settings)]
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=4), eos)
    batched = [o.token_ids for o in engine.generate(prompts, [with_processor(s) for s in settings])]
    assert plain == expected and batched == expected
    for ids in expected:
        text = byte_tok.decode(ids, skip_special_tokens=True)
        assert ids[-1] == eos[0] and re.fullmatch(r"\[[0-9]{1,3}(, [a-z]{1,4}){0,3}\]", text), text


@pytest.fixture(scope="module")
def abd_or_ace(byte_tok):
    return compile_grammar(regex_to_grammar(r"abd|ace"), TokenizerInfo.from_huggingface(byte_tok))


def test_the_logits_processor_rolls_back_to_what_the_caller_kept(byte_tok, abd_or_ace):
    """Speculation asks for masks after drafted tokens, then keeps a prefix of them and a
    correction in place of the first rejected one: the processor must return to that prefix,
    not just to that length (same length, different last token)."""
    from course.s08_structured.generate import GrammarLogitsProcessor

    a, b, c, d, e = (byte_tok.convert_tokens_to_ids(ch) for ch in "abcde")
    logits = torch.zeros(len(byte_tok))
    spec = GrammarLogitsProcessor(abd_or_ace)
    spec([], logits)
    spec([a, b], logits)  # the masks after drafts "a", "b"
    kept = spec([a, c], logits)  # "b" rejected, "c" chosen instead: after "ac", only "e" is allowed
    fresh = GrammarLogitsProcessor(abd_or_ace)([a, c], logits)
    assert torch.equal(kept.isinf(), fresh.isinf())
    assert not kept[e].isinf() and kept[d].isinf()


def test_a_mask_prepared_ahead_is_the_mask_the_call_returns(byte_tok, abd_or_ace):
    """An engine fills the mask on another thread while the forward runs (`prepare`): the call
    that follows must return exactly the mask a cold call would, fill it only once, and refill
    it when the tokens it was prepared for are not the ones the call brings."""
    from course.s08_structured.generate import GrammarLogitsProcessor

    a, b, c, d, e = (byte_tok.convert_tokens_to_ids(ch) for ch in "abcde")
    logits = torch.zeros(len(byte_tok))
    timings = []
    ahead = GrammarLogitsProcessor(abd_or_ace, timings)
    ahead.prepare([a])
    assert len(timings) == 1
    masked = ahead([a], logits)
    assert len(timings) == 1  # the prepared mask was used, not filled again
    cold = GrammarLogitsProcessor(abd_or_ace)([a], logits)
    assert torch.equal(masked.isinf(), cold.isinf()) and not masked[b].isinf() and not masked[c].isinf()
    ahead.prepare([a, b])
    after_c = ahead([a, c], logits)  # prepared for "ab", called for "ac": refilled for "ac"
    assert len(timings) == 3 and not after_c[e].isinf() and after_c[d].isinf()


def test_valid_prefix_cuts_a_draft_where_the_grammar_stops_it(byte_tok, abd_or_ace):
    """A draft is cut at its first forbidden token, and asking leaves the matcher where it was."""
    from course.s08_structured.generate import GrammarLogitsProcessor

    a, b, c, d, e = (byte_tok.convert_tokens_to_ids(ch) for ch in "abcde")
    proc = GrammarLogitsProcessor(abd_or_ace)
    assert proc.valid_prefix([], [a, b, d]) == 3
    assert proc.valid_prefix([], [a, c, d]) == 2
    assert proc.valid_prefix([a], [b, e, e]) == 1
    assert proc.valid_prefix([a], [d]) == 0
    assert proc.tokens == [a] and proc.matcher.num_accepted == 1
    masked = proc([a], torch.zeros(len(byte_tok)))
    assert not masked[b].isinf() and not masked[c].isinf() and masked[d].isinf()
