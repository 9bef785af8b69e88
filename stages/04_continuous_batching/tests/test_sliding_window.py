"""Sliding-window models in the batched engine: the same tokens as stage 01's full recompute,
and a sequence holds only the blocks its window still reads: in the one pool when every layer
slides, in the sliding layers' own group beside full layers (stage 03's layer_groups.py)."""
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


def test_sliding_window_mixed_layers_release_blocks_in_their_own_group(byte_tok):
    """A full-attention layer beside the sliding ones reads every block, so the layers form two
    groups: 8x the window on, the sliding group holds at most window / block_size + 2 blocks while
    the full group holds the whole sequence; the sliding group's pool is sized for its windows
    (window_group_blocks), far smaller than the full group's."""
    model = windowed_model(WINDOW, every_layer=False)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=BLOCK, max_num_seqs=2,
                                                     max_num_batched_tokens=8))
    full, sliding = engine.blocks.groups
    assert (full.window, sliding.window) == (None, WINDOW) and sliding.num_blocks < full.num_blocks
    assert engine.cache.nbytes < 64 * engine.cache.parts[0].nbytes // full.num_blocks * 2  # not two full pools
    prompt, n = prompts([5])[0], 8 * WINDOW
    rid = engine.add_request(prompt, greedy(n))
    held, run = [], engine._run

    def counting_run(chunks, *args):
        held.append((full.blocks_held(rid), sliding.blocks_held(rid)))
        stats = engine.stats()  # how full the cache is: the group with the least room left
        usage.append((1 - stats["free_blocks"] / stats["num_blocks"],
                      max(1 - g.num_free_blocks / g.num_blocks for g in (full, sliding))))
        return run(chunks, *args)

    engine._run, tokens, usage = counting_run, [], []
    while engine.has_unfinished():
        tokens += [out.event.token_id for out in engine.step() if out.event]
    assert tokens == generate_naive(model, byte_tok, prompt, greedy(n)).token_ids
    assert max(s for _, s in held) <= WINDOW // BLOCK + 2
    assert held[-1][0] == -(-(len(prompt) + n - 1) // BLOCK)  # the full layers keep every block
    assert full.num_free_blocks == full.num_blocks and sliding.num_free_blocks == sliding.num_blocks
    assert all(a == b for a, b in usage) and engine.stats()["free_blocks"] == engine.stats()["num_blocks"]


def test_sliding_window_group_size_bounds_what_running_requests_hold(byte_tok, monkeypatch):
    """The sliding group's size (window_group_blocks) bounds what it must hold: with a pool too big
    to matter, many requests at once (long prompts in chunks, decodes beside them) never hold more
    of it at a step's peak, and every request's tokens equal stage 01's."""
    from course.s03_paged import layer_groups

    model = windowed_model(WINDOW, every_layer=False)
    seqs, budget = 4, 10
    monkeypatch.setattr("course.s04_continuous_batching.engine.group_blocks",  # every pool as big as the full one
                        lambda groups, num_blocks, *a: [num_blocks] * len(groups))
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=256, block_size=BLOCK, max_num_seqs=seqs,
                                                     max_num_batched_tokens=budget))
    sliding, peaks, run = engine.blocks.groups[1], [], engine._run

    def counting_run(chunks, *args):
        peaks.append(sliding.num_blocks - sliding.num_free_blocks)
        return run(chunks, *args)

    engine._run = counting_run
    lens, outs_n = [3, 41, 17, 9, 30, 2], [25, 8, 20, 14, 6, 30]
    outs = engine.generate(prompts(lens, seed=4), [greedy(n) for n in outs_n])
    for p, n, out in zip(prompts(lens, seed=4), outs_n, outs):
        assert out.token_ids == generate_naive(model, byte_tok, p, greedy(n)).token_ids
    assert max(peaks) <= layer_groups.window_group_blocks(WINDOW, BLOCK, seqs, budget) < 256


def test_sliding_window_mixed_layers_prefix_hit_needs_only_the_window_cached(byte_tok):
    """A cached prefix whose early blocks the sliding group has reused still hits: that group
    needs only the blocks the first new token's window sees (the rest point at a block never read),
    and the tokens equal a cold run's."""
    model = windowed_model(WINDOW, every_layer=False)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=BLOCK, max_num_seqs=1,
                                                     max_num_batched_tokens=8))
    full, sliding = engine.blocks.groups
    shared = prompts([32], seed=3)[0]
    engine.generate([shared + [1, 2, 3]], [greedy(4)])  # its 8 shared blocks: more than the sliding group has
    second = shared + [7, 8]
    assert sliding.num_blocks < 8 and len(sliding.hash_to_block) < len(full.hash_to_block)
    before = engine.blocks.prefix_hit_tokens
    out = engine.generate([second], [greedy(10)])[0]
    assert engine.blocks.prefix_hit_tokens - before == 32
    assert out.token_ids == generate_naive(model, byte_tok, second, greedy(10)).token_ids


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
