"""final/'s engine (speculation inside the batch, grammars) on shard 0 of a two-process gloo group:
the TP=1 engine's greedy tokens, exactly."""
import pytest

from course.final.engine import Engine, SpeculativeConfig
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import save_hf_folder, tiny_model
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec
from course.s07_disaggregated.testing import alive

GRAMMAR = r"\[[0-9]{1,3}(, [a-z]{1,4}){0,3}\]"
PROMPTS = [list(b"abcabcabcabc abcabc"), list(b"list: "), list(b"the cat sat on the mat, the cat sat")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    path = tmp_path_factory.mktemp("tp_final")
    save_hf_folder(tiny_model("qwen2_bias"), byte_tok, path)  # 6 heads / 2 KV heads, biases, untied
    return path


def generate(engine, grammar=None):
    params = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=grammar is None)
    ids = [engine.add_request(p, params, grammar=grammar() if grammar and i == 1 else None)
           for i, p in enumerate(PROMPTS)]
    while engine.has_unfinished():
        engine.step()
    return [engine.requests[i].seq.output_ids for i in ids]


def test_lookup_speculation_and_a_grammar_under_tp2_give_the_tp1_tokens(folder, byte_tok):
    from course.s08_structured.generate import GrammarLogitsProcessor
    from course.s08_structured.matcher import compile_grammar
    from course.s08_structured.frontends.regex_parser import regex_to_grammar
    from course.s08_structured.vocab import TokenizerInfo

    eos = byte_tok.eos_token_id
    compiled = compile_grammar(regex_to_grammar(GRAMMAR), TokenizerInfo.from_huggingface(byte_tok, stop_ids=[eos]))
    grammar = lambda: GrammarLogitsProcessor(compiled)  # noqa: E731
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=24)
    lookup = SpeculativeConfig("lookup", 3)
    want = generate(Engine(load_model(folder).model, byte_tok, config, [eos], lookup), grammar)
    with TensorParallel.start(TPSpec(2, str(folder), timeout_s=60)) as tp:
        loaded, model = tp.load_shard()
        engine = Engine(model, byte_tok, config, [eos], lookup)
        tp.attach(engine, log=lambda line: None)
        got = generate(engine, grammar)
        assert engine.spec_stats.accepted > 0  # drafts were verified under TP
    assert got == want
    assert not any(alive(p.pid) for p in tp.processes)
