"""A hybrid model (Qwen3-Next: gated DeltaNet layers beside full attention) in the batched engine:
the same tokens as stage 01's whole-sequence recompute through chunked prefill, batching and
preemption, and prefix caching that resumes the recurrent state from a snapshot."""
import pytest
import torch

from course.s01_decode_loop.families.testing import family_model
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.hybrid.engine import HybridStates
from course.s04_continuous_batching.hybrid.states import RecurrentStates

BLOCK = 4


class HybridEngine(HybridStates, LLMEngine):
    pass


@pytest.fixture(scope="module")
def model():
    return family_model("qwen3_next")


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def prompts(lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


@pytest.mark.parametrize("budget,num_blocks", [(5, 64), (64, 64), (32, 10)], ids=["chunks", "whole", "preempting"])
def test_hybrid_batched_equals_whole_sequence_recompute(model, byte_tok, budget, num_blocks):
    lens, outs_n = [3, 29, 17, 9], [12, 8, 10, 14]
    engine = HybridEngine(model, byte_tok, EngineConfig(num_blocks=num_blocks, block_size=BLOCK,
                                                        max_num_batched_tokens=budget))
    outs = engine.generate(prompts(lens), [greedy(n) for n in outs_n])
    for p, n, out in zip(prompts(lens), outs_n, outs):
        assert out.token_ids == generate_naive(model, byte_tok, p, greedy(n)).token_ids
    if num_blocks == 10:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    assert engine.blocks.num_free_blocks == num_blocks and not engine.states.current
    # K/V for the attention layers only: a linear layer's past is its state
    attention_layers = model.config.mixer_types.count("full_attention")
    assert engine.cache.k.shape[0] == attention_layers < model.config.num_hidden_layers


def test_hybrid_prefix_hit_resumes_the_state_and_recomputes_at_most_one_block(model, byte_tok):
    """A second request sharing a cached 256-token prefix resumes from the snapshot at its deepest
    boundary, recomputing at most one block of the prefix, and answers as a cold run (no prefix
    cache; the cold run equals stage 01's recompute, the test above)."""
    block = 16  # (real models' block size: a snapshot each 16 tokens)
    engine = HybridEngine(model, byte_tok, EngineConfig(num_blocks=48, block_size=block, max_num_batched_tokens=64))
    shared = prompts([256], seed=3)[0]
    engine.generate([shared + [1, 2, 3]], [greedy(6)])
    second = shared + [7, 8]
    hit_before = engine.blocks.prefix_hit_tokens
    out = engine.generate([second], [greedy(8)])[0]
    assert engine.blocks.prefix_hit_tokens - hit_before >= 256 - block
    assert engine.states.restored_tokens >= 256 - block
    cold = HybridEngine(model, byte_tok, EngineConfig(num_blocks=48, block_size=block, max_num_batched_tokens=64,
                                                      enable_prefix_caching=False))
    assert out.token_ids == cold.generate([second], [greedy(8)])[0].token_ids


def test_hybrid_without_a_snapshot_the_hit_stops_where_one_is(model, byte_tok):
    """Snapshots only every 4 blocks: a hit is cut to the deepest of them, never resumed without a state."""
    engine = HybridEngine(model, byte_tok, EngineConfig(num_blocks=128, block_size=BLOCK),
                          state_interval=4 * BLOCK)
    shared = prompts([27], seed=5)[0]
    engine.generate([shared], [greedy(2)])
    before = engine.blocks.prefix_hit_tokens
    second = shared + [9]
    out = engine.generate([second], [greedy(5)])[0]
    assert engine.blocks.prefix_hit_tokens - before == 16  # 24 tokens of whole blocks cached, snapshots at 16
    assert out.token_ids == generate_naive(model, byte_tok, second, greedy(5)).token_ids


def test_hybrid_state_snapshots_must_fall_on_blocks():
    with pytest.raises(ValueError, match="multiple of the block"):
        RecurrentStates([0], block_size=4, interval=6)


def test_hybrid_the_plain_engine_refuses_by_name(model, byte_tok):
    """Without the state cache a linear layer would continue from an empty state: refused, never wrong."""
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=5))
    with pytest.raises(ValueError, match="whole sequences"):
        engine.generate(prompts([12]), [greedy(3)])


def test_hybrid_boundary_names_chain_on_and_equal_the_block_managers():
    """The names the state cache gives its snapshots, chained step to step, are the prefix hashes
    the block manager names those blocks with, whatever the steps' sizes."""
    from course.s04_continuous_batching.hybrid.states import prefix_hash

    states, ids, start = RecurrentStates([0], block_size=4, interval=8), list(range(100)), 0
    for rows in (3, 20, 1, 1, 9, 30):
        states.begin_step([(7, ids, start, rows)])
        want = {n: prefix_hash(ids, n, 4) for n in range(8, start + rows + 1, 8) if n > start}
        assert states.keys[0] == want
        states.end_step()
        start += rows


def test_hybrid_usable_prefix_is_the_deepest_boundary_with_every_layers_snapshot():
    """The hashing done once along the prefix finds what naming each boundary from scratch finds:
    the deepest boundary at or below the hit whose snapshot holds every linear layer."""
    from course.s04_continuous_batching.hybrid.states import prefix_hash

    states, ids = RecurrentStates([0, 2], block_size=4, interval=8), list(range(200))
    assert states.usable_prefix(ids, 160) == 0  # no snapshot yet
    for length, layers in [(16, (0, 2)), (48, (0, 2)), (64, (0,)), (120, (0, 2))]:
        states.snapshots[prefix_hash(ids, length, 4)] = {layer: None for layer in layers}
    for hit, want in [(7, 0), (16, 16), (47, 16), (63, 48), (70, 48), (119, 48), (120, 120), (199, 120)]:
        assert states.usable_prefix(ids, hit) == want
    other = ids[:40] + [0] * 160  # parts from the snapshots' sequence at 40
    assert states.usable_prefix(other, 199) == 16
