"""Layer groups (layer_groups.py): a pool and block tables per kind of layer, and the prefix hits a
sliding window allows (block_manager.py)."""
import pytest
import torch

from course.s01_decode_loop.testing import windowed_model
from course.s03_paged.block_manager import BlockManager, NoFreeBlocksError
from course.s03_paged.layer_groups import GroupedBlocks, GroupedKVCache, layer_groups, window_group_blocks

BS = 4


def test_layer_groups_put_full_attention_first_and_one_group_per_window():
    assert layer_groups((None, 6, None, 6)) == [(None, (0, 2)), (6, (1, 3))]
    assert layer_groups((8, None, 4, 8)) == [(None, (1,)), (8, (0, 3)), (4, (2,))]
    assert layer_groups((6, 6, 6)) == [] and layer_groups(()) == []  # every layer alike: one table


def test_window_group_blocks_counts_each_sequences_window_and_one_steps_tokens():
    # 2 sequences, window 6 (5 earlier positions: 2 blocks, + the block it starts, + a partial one), 10 new tokens
    assert window_group_blocks(6, BS, 2, 10) == 2 * (2 + 2) + 3


def fill(bm: BlockManager, seq_id: int, ids: list[int]) -> None:
    """Allocate and commit `ids` as if computed."""
    bm.allocate(seq_id, ids)
    bm.commit(seq_id, ids)


def test_window_prefix_hit_needs_only_the_blocks_its_window_sees():
    """With a window of 6 (blocks of 4), a hit of 8 blocks needs blocks 6 and 7 cached (the first
    new token, at 32, sees 27..32): the earlier ones may be gone, their entries released."""
    ids = list(range(40))
    bm = BlockManager(12, BS, window=6)
    fill(bm, 0, ids)  # blocks 0-7 released behind the window as it moved: cached, least recent first
    bm.free(0)
    fill(bm, 1, list(range(100, 120)))  # 5 blocks: 2 empty ones, then blocks 0-2 evicted
    bm.free(1)
    hits = bm.cached_prefix(ids[:34])
    assert hits[:6] == [None] * 6 and None not in hits[6:] and len(hits) == 8
    assert bm.allocate(2, ids[:34]) == 32
    assert bm.released[2] == 6 and bm.blocks_held(2) == 3  # blocks 6, 7 and a fresh one
    bm.free(2)
    assert bm.num_free_blocks == 12


def test_a_window_takes_blocks_for_the_next_steps_tokens_only():
    """A long prompt under a window takes blocks chunk by chunk: `budget` tokens now, not its length."""
    bm = BlockManager(6, BS, window=6)
    prompt = list(range(100))  # 25 blocks: far more than the pool
    assert not bm.can_allocate(prompt) and bm.can_allocate(prompt, budget=8)
    bm.allocate(0, prompt, budget=8)
    assert bm.blocks_held(0) == 2
    with pytest.raises(NoFreeBlocksError, match="whole pool"):
        BlockManager(6, BS).allocate(0, prompt)


def grouped(full_blocks=16, sliding_blocks=6, window=6) -> GroupedBlocks:
    return GroupedBlocks([BlockManager(full_blocks, BS), BlockManager(sliding_blocks, BS, window=window)])


def test_grouped_blocks_grow_together_and_release_only_in_the_sliding_group():
    blocks = grouped()
    ids = list(range(9))
    blocks.allocate(0, ids)
    for n in range(10, 41):  # decode to 40 tokens
        blocks.append_slot(0, n)
        blocks.commit(0, list(range(n)), n - 1)
        full, sliding = (g.blocks_held(0) for g in blocks.groups)
        assert full == -(-n // BS) and sliding <= 6 // BS + 2
        assert len(blocks.groups[0].tables[0]) == len(blocks.groups[1].tables[0])
    blocks.free(0)
    assert [g.num_free_blocks for g in blocks.groups] == [16, 6] and blocks.num_free_blocks == 6


def test_grouped_blocks_change_every_group_or_none():
    """The sliding group has room, the full one not: nothing is allocated anywhere."""
    blocks = grouped(full_blocks=3, sliding_blocks=6)
    assert not blocks.can_allocate(list(range(13)))
    with pytest.raises(NoFreeBlocksError):
        blocks.allocate(0, list(range(13)))
    assert [g.num_free_blocks for g in blocks.groups] == [3, 6] and not blocks.tables
    blocks.allocate(0, list(range(12)))
    with pytest.raises(NoFreeBlocksError, match="every layer group"):
        blocks.append_slot(0, 13)
    assert [len(g.tables[0]) for g in blocks.groups] == [3, 3]


def test_grouped_prefix_hit_is_the_longest_every_group_serves():
    """The sliding group has the whole prefix cached, the full group lost its tail (freed first,
    evicted first): the hit is the full group's, and the sliding group takes only its window's
    blocks of it."""
    blocks = grouped(full_blocks=12, sliding_blocks=32)
    ids = list(range(41))
    blocks.allocate(0, ids)
    blocks.commit(0, ids)
    blocks.free(0)
    blocks.allocate(1, list(range(100, 116)))  # 4 blocks: the full group evicts two of the prefix's
    blocks.free(1)
    full, sliding = blocks.groups
    assert len(full.cached_prefix(ids)) == 8 and len(sliding.cached_prefix(ids)) == 10
    assert blocks.common_hits(ids) == 8 and blocks.allocate(2, ids) == 32
    assert [g.hashed[2][0] for g in blocks.groups] == [8, 8] and sliding.released[2] == 6


def test_grouped_cache_gives_each_layer_its_groups_pool():
    model = windowed_model(6, every_layer=False)
    windows = model.config.layer_windows
    groups = layer_groups(windows)
    cache = GroupedKVCache(model.config, groups, [10, 3], BS, torch.float32)
    for layer, window in enumerate(windows):
        k, v = cache.pools(layer)
        assert k.shape[0] == (10 if window is None else 3)
        assert cache.group_of[layer] == (0 if window is None else 1)
    slots = torch.tensor([2 * BS + 1])
    x = torch.randn(1, model.config.num_key_value_heads, model.config.head_dim)
    cache.write(len(windows) - 1, slots, x, -x)
    part = cache.parts[1]
    assert torch.equal(part.k[0].view(-1, *x.shape[1:])[slots], x) and not cache.parts[0].k.any()
    assert cache.nbytes == sum(p.nbytes for p in cache.parts)
    with pytest.raises(ValueError, match="group by group"):
        cache.tensors()
