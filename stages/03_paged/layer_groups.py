"""Layer groups: a block table per kind of layer, when a model's layers do not all remember alike.

Gemma 3 and gpt-oss interleave sliding-window layers with full-attention ones. With one block
table for every layer, nothing can be released (a full layer still reads every block), so the
sliding layers keep the whole sequence too. Here each kind of layer is a *group* with its own
pool and block manager (vLLM's hybrid KV cache manager groups layers the same way):

    group 0  the full-attention layers       every block of the sequence
    group 1  the layers sliding over W       ~W / block_size + 1 blocks; those behind W released

A sequence has a table in every group, all of one length (an entry per block of its positions;
an entry behind a window names a block it no longer holds, never read). A step builds metadata
per group and each layer reads its own group's (`PagedAttentionMetadata.for_layer`). A prefix hit
is the longest one every group can serve. The sliding group's pool is sized for what the running
sequences can hold at once (`window_group_blocks`), so its memory no longer grows with context.
"""
from __future__ import annotations

from .block_manager import BlockManager, NoFreeBlocksError
from .paged_attention import PagedKVCache


def layer_groups(windows: tuple[int | None, ...]) -> list[tuple[int | None, tuple[int, ...]]]:
    """(window, layers) per group: full attention first, then each window in the order layers
    use it. Empty when every layer reads alike (one table serves them all)."""
    kinds = sorted(dict.fromkeys(windows), key=lambda w: w is not None)  # stable: None first
    if len(kinds) < 2:
        return []
    return [(w, tuple(layer for layer, x in enumerate(windows) if x == w)) for w in kinds]


def window_group_blocks(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Blocks a sliding group needs so that it runs short no sooner than the full group: each
    running sequence sees its last window - 1 positions (plus the block its next token starts),
    and one step adds at most max_num_batched_tokens more."""
    return max_num_seqs * (-(-(window - 1) // block_size) + 2) + -(-max_num_batched_tokens // block_size)


def group_blocks(groups: list[tuple[int | None, tuple[int, ...]]], num_blocks: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """Each group's pool, in blocks: the full group `num_blocks`, a sliding group what its windows
    need (`window_group_blocks`), never more than the full group's."""
    return [num_blocks if w is None else min(num_blocks, window_group_blocks(w, block_size, max_num_seqs,
                                                                              max_num_batched_tokens))
            for w, _ in groups]


class GroupedBlocks:
    """A BlockManager per group behind BlockManager's interface, so the scheduler and the engines
    ask one pool and are answered for all: a change is made in every group or in none."""

    def __init__(self, groups: list[BlockManager]):
        self.groups = groups
        self.block_size = groups[0].block_size
        self.enable_prefix_caching = groups[0].enable_prefix_caching

    # ---- questions: every group's tables have one length, so group 0 answers for the shape
    @property
    def tables(self) -> dict[int, list[int]]:
        return self.groups[0].tables

    @property
    def hashed(self):
        return self.groups[0].hashed

    # what a view of "the pool" reads (stage 04's watch): the full-attention layers' pool
    blocks = property(lambda self: self.groups[0].blocks)
    free_ids = property(lambda self: self.groups[0].free_ids)
    cached_free = property(lambda self: self.groups[0].cached_free)

    @property
    def window(self) -> int | None:
        """The narrowest window: a long prompt's blocks come chunk by chunk (the scheduler asks)."""
        return min((g.window for g in self.groups if g.window is not None), default=None)

    @property
    def num_blocks(self) -> int:
        return self.groups[0].num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can grow by in every group (its tables grow together)."""
        return min(g.num_free_blocks for g in self.groups)

    @property
    def fullest(self) -> BlockManager:
        """The group with the least room left for its size: how full the whole cache is."""
        return min(self.groups, key=lambda g: g.num_free_blocks / g.num_blocks)

    @property
    def prefix_hit_tokens(self) -> int:
        return self.groups[0].prefix_hit_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.groups[0].prompt_tokens

    @property
    def prefix_limit(self):
        return self.groups[0].prefix_limit

    @prefix_limit.setter
    def prefix_limit(self, limit) -> None:
        for g in self.groups:
            g.prefix_limit = limit

    def blocks_needed(self, num_tokens: int) -> int:
        return self.groups[0].blocks_needed(num_tokens)

    def blocks_held(self, seq_id: int) -> int:
        """Blocks the sequence holds, all groups together (`groups[g].blocks_held`: one group's)."""
        return sum(g.blocks_held(seq_id) for g in self.groups)

    def common_hits(self, token_ids: list[int]) -> int:
        """The most leading blocks of `token_ids` every group can take from its cache: each
        group's longest usable hit within the others', until they agree."""
        n = None
        while True:
            m = min(len(g.cached_prefix(token_ids, n)) for g in self.groups)
            if m == n:
                return n
            n = m

    def cached_prefix(self, token_ids: list[int]) -> list[int | None]:
        return self.groups[0].cached_prefix(token_ids, self.common_hits(token_ids))

    def can_allocate(self, token_ids: list[int], budget: int | None = None) -> bool:
        n = self.common_hits(token_ids)
        return all(g.can_allocate(token_ids, budget, n) for g in self.groups)

    # ---- changes: checked in every group first, then made in every group -------------------
    def allocate(self, seq_id: int, token_ids: list[int], budget: int | None = None) -> int:
        n = self.common_hits(token_ids)
        if not all(g.can_allocate(token_ids, budget, n) for g in self.groups):
            raise NoFreeBlocksError(f"not enough free KV blocks now ({self.num_free_blocks} free in the "
                                    "fullest layer group)")
        return [g.allocate(seq_id, token_ids, budget, n) for g in self.groups][0]

    def append_slot(self, seq_id: int, num_tokens: int) -> None:
        missing = self.blocks_needed(num_tokens) - len(self.tables[seq_id])
        if missing > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id} needs {missing} more block(s) in every layer group")
        for g in self.groups:
            g.append_slot(seq_id, num_tokens)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        for g in self.groups:
            g.truncate(seq_id, num_tokens)

    def commit(self, seq_id: int, token_ids, num_tokens: int | None = None) -> None:
        for g in self.groups:
            g.commit(seq_id, token_ids, num_tokens)

    def fork(self, parent_id: int, child_id: int) -> list[tuple[int, int, int]]:
        """(group, src, dst) block copies for GroupedKVCache.copy_blocks."""
        if self.num_free_blocks < 1:
            raise NoFreeBlocksError("no free block for the forked sequence's last block")
        return [(i, src, dst) for i, g in enumerate(self.groups) for src, dst in g.fork(parent_id, child_id)]

    def free(self, seq_id: int) -> None:
        for g in self.groups:
            g.free(seq_id)

    def group_seqs(self, seqs: list[tuple[int, int, list[int]]], request_ids: list[int]) -> list[list]:
        """A step's (num_cached, num_new, block_table) per sequence (group 0's tables), as every
        other group sees it: the same tokens, that group's tables."""
        return [[(c, n, g.tables[r]) for (c, n, _), r in zip(seqs, request_ids)] for g in self.groups[1:]]


class GroupedKVCache(PagedKVCache):
    """PagedKVCache's interface over a pool per group: layer l's K/V (`k[l]`, `pools(l)`) live in
    its group's pool, which has the group's own number of blocks."""

    def __init__(self, config, groups: list[tuple[int | None, tuple[int, ...]]], group_blocks: list[int],
                 block_size: int, dtype, device="cpu", kv_dtype=None):
        self.parts = [PagedKVCache(config, n, block_size, dtype, device, kv_dtype, num_layers=len(layers))
                      for (_, layers), n in zip(groups, group_blocks)]
        self.dtype, self.kv_dtype = self.parts[0].dtype, self.parts[0].kv_dtype
        self.block_size, self.windows = block_size, config.layer_windows
        where = sorted((layer, g, i) for g, (_, layers) in enumerate(groups) for i, layer in enumerate(layers))
        self.group_of = [g for _, g, _ in where]  # layer -> its group
        pick = lambda name: [getattr(self.parts[g], name)[i] for _, g, i in where]  # noqa: E731
        self.k, self.v = pick("k"), pick("v")  # per layer: a view into its group's pool
        self.k_scale = self.v_scale = None
        if self.parts[0].quantized:
            self.k_scale, self.v_scale = pick("k_scale"), pick("v_scale")

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def tensors(self):
        raise ValueError("a cache with layer groups keeps a pool per group, each with its own block ids: "
                         "move blocks group by group (cache.parts[g].tensors())")

    def copy_blocks(self, pairs: list[tuple[int, int, int]]) -> None:
        """(group, src, dst) block copies (GroupedBlocks.fork)."""
        for g, src, dst in pairs:
            self.parts[g].copy_blocks([(src, dst)])


def group_metadata(meta, others: list, cache: GroupedKVCache):
    """`meta` (built from group 0's tables) with each layer's own, `others` being the metadata
    built from every other group's tables (`GroupedBlocks.group_seqs`): `meta.for_layer(l)` then
    answers layer l's group's."""
    metas = [meta, *others]
    meta.by_layer = [metas[g] for g in cache.group_of]
    return meta
