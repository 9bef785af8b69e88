"""Sliding-window models in the batched engine: the same tokens as stage 01's full recompute,
and, when every layer slides, a sequence holds only the blocks its window still reads."""
import pytest
import torch

from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import windowed_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

WINDOW, BLOCK = 6, 4


def record_held(engine, rid) -> list[int]:
    """The blocks `rid` holds at each forward: after scheduling (its new blocks taken), before the
    step's commit releases any: the peak of every step."""
    held, run = [], engine._run

    def counting_run(chunks, *args):
        held.append(engine.blocks.blocks_held(rid))
        return run(chunks, *args)

    engine._run = counting_run
    return held


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def prompts(lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


@pytest.mark.parametrize("every_layer", [True, False], ids=["all_sliding", "mixed"])
@pytest.mark.parametrize("budget,num_blocks", [(5, 64), (64, 64), (32, 10)], ids=["chunks", "whole", "preempting"])
def test_sliding_window_batched_equals_full_recompute(byte_tok, every_layer, budget, num_blocks):
    """Chunked prefill that splits a window, whole prompts, and a pool small enough to preempt
    when every block is kept: every request's greedy tokens equal stage 01's (which recomputes
    the whole sequence)."""
    model = windowed_model(WINDOW, every_layer)
    lens, outs_n = [3, 29, 17, 9], [25, 8, 20, 14]
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=num_blocks, block_size=BLOCK,
                                                     max_num_batched_tokens=budget))
    outs = engine.generate(prompts(lens), [greedy(n) for n in outs_n])
    for p, n, out in zip(prompts(lens), outs_n, outs):
        assert out.token_ids == generate_naive(model, byte_tok, p, greedy(n)).token_ids
    if budget == 32:  # too small for the mixed model's blocks; the released ones leave room
        assert (engine.scheduler.num_preemptions > 0) == (not every_layer)
    assert engine.blocks.num_free_blocks == num_blocks


def test_sliding_window_a_long_generation_holds_only_its_window(byte_tok):
    """8x the window: the sequence never holds more than window / block_size + 2 blocks."""
    model = windowed_model(WINDOW, every_layer=True)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=32, block_size=BLOCK))
    prompt, n = prompts([5])[0], 8 * WINDOW
    rid = engine.add_request(prompt, greedy(n))
    held, tokens = record_held(engine, rid), []
    while engine.has_unfinished():
        tokens += [out.event.token_id for out in engine.step() if out.event]
    assert tokens == generate_naive(model, byte_tok, prompt, greedy(n)).token_ids
    assert max(held) <= WINDOW // BLOCK + 2
    assert len(engine.blocks.tables) == 0 and engine.blocks.num_free_blocks == 32


def test_sliding_window_mixed_layers_keep_every_block(byte_tok):
    """A full-attention layer beside the sliding ones still reads every block: nothing is released."""
    model = windowed_model(WINDOW, every_layer=False)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=32, block_size=BLOCK))
    assert engine.blocks.window is None


def test_sliding_window_prefix_cache_hit_equals_a_cold_run(byte_tok):
    """A second request sharing a cached prefix (its blocks released behind the first one's window,
    but still cached) recomputes only past the hit, and its tokens equal a cold run's."""
    model = windowed_model(WINDOW, every_layer=True)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=BLOCK))
    shared = prompts([32], seed=3)[0]
    first, second = shared + [1, 2, 3], shared + [7, 8]
    engine.generate([first], [greedy(10)])
    before = engine.blocks.prefix_hit_tokens
    out = engine.generate([second], [greedy(10)])[0]
    assert engine.blocks.prefix_hit_tokens - before == 32  # every full block of the shared prefix
    assert out.token_ids == generate_naive(model, byte_tok, second, greedy(10)).token_ids


def test_sliding_window_a_long_prompt_in_chunks_holds_only_its_window_and_a_chunk(byte_tok):
    """A prompt 8x the window, prefilled in chunks: its blocks come chunk by chunk and go behind the
    window, so it never holds more than (window + chunk) / block_size + 2 blocks."""
    model = windowed_model(WINDOW, every_layer=True)
    budget = 8
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=32, block_size=BLOCK, max_num_batched_tokens=budget))
    prompt = prompts([8 * WINDOW], seed=2)[0]
    rid = engine.add_request(prompt, greedy(4))
    held, tokens = record_held(engine, rid), []
    while engine.has_unfinished():
        tokens += [out.event.token_id for out in engine.step() if out.event]
    assert tokens == generate_naive(model, byte_tok, prompt, greedy(4)).token_ids
    assert max(held) <= (WINDOW + budget) // BLOCK + 2
