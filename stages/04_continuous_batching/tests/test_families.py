"""Gemma 3 and gpt-oss (stage 01's families/: interleaved sliding and full layers, sinks) in the
batched engine: chunked prefill and preemption, the same greedy ids as stage 01's recompute.
(Qwen3-Next, whose layers keep a state, runs through hybrid/: its own tests.)"""
import pytest

from course.s01_decode_loop.families.testing import family_model
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

LENS = [(3, 30), (70, 4), (17, 22), (41, 9)]  # (prompt, answer): stage 04's preemption test's shapes
PROMPTS = [[(7 * i + n) % 256 for i in range(n)] for n, _ in LENS]
PARAMS = [SamplingParams(max_new_tokens=m, temperature=0.0, ignore_eos=True) for _, m in LENS]


@pytest.mark.parametrize("model_type", ["gemma3_text", "gpt_oss"])
@pytest.mark.parametrize("num_blocks", [64, 20], ids=["roomy", "preempting"])
def test_families_batched_equal_stage01(byte_tok, model_type, num_blocks):
    model = family_model(model_type)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=num_blocks, block_size=4,
                                                            max_num_batched_tokens=32))
    outs = engine.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == [generate_naive(model, byte_tok, p, sp).token_ids
                                           for p, sp in zip(PROMPTS, PARAMS)]
    if num_blocks == 20:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
