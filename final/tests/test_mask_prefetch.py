"""Grammar masks filled on a worker thread while the forward runs: the same tokens as masks filled
after it, every mask of a plain decode filled ahead, and a processor that fails ahead of time
still fails its own request alone."""
import re
import threading

import pytest

from course.final.engine import Engine
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.vocab import TokenizerInfo

GRAMMAR = r"\[[0-9]{1,3}(, [a-z]{1,4}){0,3}\]"
PROMPTS = [list(b"list: "), list(b"Another prompt, longer than the first one: "), list(b"x")]
SETTINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=20, seed=4)]


class WhereFilled(GrammarLogitsProcessor):
    """Records the thread of every mask it actually fills (not of calls that find it ready)."""

    def __init__(self, compiled):
        super().__init__(compiled, timings=[])
        self.fill_threads: list[str] = []

    def prepare(self, output_ids):
        filled = len(self.timings)
        super().prepare(output_ids)
        if len(self.timings) > filled:
            self.fill_threads.append(threading.current_thread().name)


@pytest.fixture(scope="module")
def compiled(byte_tok):
    return compile_grammar(regex_to_grammar(GRAMMAR),
                           TokenizerInfo.from_huggingface(byte_tok, stop_ids=[byte_tok.eos_token_id]))


def run(byte_tok, compiled, prefetch: bool):
    engine = Engine(tiny_model("mha_untied"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4),
                    [byte_tok.eos_token_id], prefetch_masks=prefetch)
    processors = [WhereFilled(compiled) for _ in PROMPTS]
    ids = [engine.add_request(prompt, SamplingParams(max_new_tokens=24, **s), grammar=p)
           for prompt, p, s in zip(PROMPTS, processors, SETTINGS)]
    while engine.has_unfinished():
        engine.step()
    return [engine.requests[i].seq.output_ids for i in ids], processors


def test_masks_filled_during_the_forward_give_the_same_tokens(byte_tok, compiled):
    ahead, processors = run(byte_tok, compiled, prefetch=True)
    after, plain = run(byte_tok, compiled, prefetch=False)
    assert ahead == after
    for ids in ahead:
        assert re.fullmatch(GRAMMAR, byte_tok.decode(ids, skip_special_tokens=True))
    # every mask was filled once per sampled token, and with prefetching always on the worker
    for proc, ids in zip(processors, ahead):
        assert len(proc.fill_threads) == len(ids)
        assert all(name.startswith("masks") for name in proc.fill_threads)
    assert all(name == threading.current_thread().name for p in plain for name in p.fill_threads)


def test_a_processor_failing_ahead_of_time_fails_only_its_request(byte_tok, compiled):
    class Broken(GrammarLogitsProcessor):
        def prepare(self, output_ids):
            if output_ids:
                raise RuntimeError("mask store lost")
            super().prepare(output_ids)

    engine = Engine(tiny_model("mha_untied"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4),
                    [byte_tok.eos_token_id])
    bad = engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=8, temperature=0.0),
                             grammar=Broken(compiled))
    good = engine.add_request(PROMPTS[1], SamplingParams(max_new_tokens=8, temperature=0.0),
                              grammar=GrammarLogitsProcessor(compiled))
    while engine.has_unfinished():
        engine.step()
    assert engine.requests[bad].finish_reason == "error" and "mask store lost" in str(engine.requests[bad].error)
    assert engine.requests[good].finish_reason in ("stop", "length") and engine.requests[good].error is None
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
