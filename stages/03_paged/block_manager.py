"""Paged KV memory: a pool of fixed-size blocks, per-sequence block tables, reference counts,
and prefix caching by hashed blocks (the memory side of PagedAttention, Kwon et al. 2023).

A sequence's K/V no longer needs one contiguous reservation for its longest possible length:
it owns a list of blocks (its *block table*), one more each time the last one fills up.

Prefix caching: a *full* block is named by a chained hash of its token ids and of the block
before it, so equal hashes mean equal prefixes. A new request reuses every cached full block
of its prompt and computes only the rest. A freed block keeps its hash and stays reusable
until memory pressure evicts it (least recently freed first).

Partially filled blocks are never shared, so no one ever writes into a block someone else
reads. Two places where that matters:
  * a prompt whose blocks are *all* cached still needs logits for its last token, so the last
    block is not taken from the cache but recomputed into a private block;
  * `fork` (parallel sampling) shares the full blocks and gives the child a private copy of
    the partial last block: the caller copies that block's K/V (copy at fork time).

Sliding windows: when every layer of the model attends only to its last `window` positions, a
block that lies wholly before the window of every query still to come is never read again. As
a sequence's computed length passes it, the block is released (to the cache, if named, or to
the free list): a long generation holds about window / block_size + 1 blocks, not its length.
Its entry stays in the table (positions still index it), but attention never reads it. For the
same reason a prefix hit needs only the cached blocks its first new token can still see: those
behind its window may be gone (their entries point at block 0, never read), and a new prompt
takes blocks for its first chunk only; the rest come chunk by chunk, as the window moves.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from hashlib import blake2b

from course.s02_kv_cache.kv_cache import CacheCapacityError


class NoFreeBlocksError(CacheCapacityError):
    """The pool cannot hold this request now; nothing was changed."""


def hash_block(prev_hash: bytes | None, token_ids) -> bytes:
    """Chained block hash: equal hashes mean the same tokens *and* the same prefix before them."""
    h = blake2b(prev_hash or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # set once the block is full and its K/V computed


def uniform_window(layer_windows: tuple[int | None, ...]) -> int | None:
    """The window, when every layer slides over the same one (blocks behind it can go); else None:
    a layer that attends to everything (Gemma 3's global layers) still reads every block."""
    return layer_windows[0] if layer_windows and None not in layer_windows and len(set(layer_windows)) == 1 else None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 window: int | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))   # empty blocks
        self.cached_free: OrderedDict[bytes, int] = OrderedDict()  # ref 0 but hashed: LRU order
        self.hash_to_block: dict[bytes, int] = {}              # every hashed block, used or not
        self.tables: dict[int, list[int]] = {}                  # seq_id -> block ids
        self.hashed: dict[int, tuple[int, bytes | None]] = {}  # seq_id -> (blocks named, last hash)
        self.window = window                                    # every layer's sliding window, or None
        # prefix hits are usable only up to where every layer can resume: (token_ids, hit tokens) ->
        # usable tokens. None: all of them (K/V alone); a linear-attention layer also needs its state
        # saved there (stage 04's hybrid/)
        self.prefix_limit = None
        self.released: dict[int, int] = {}                      # seq_id -> leading blocks behind the window
        self.prefix_hit_tokens = 0                              # statistics
        self.prompt_tokens = 0

    # ---- questions ----------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def blocks_held(self, seq_id: int) -> int:
        """Blocks the sequence holds now (its table, less those released behind the window)."""
        return len(self.tables[seq_id]) - self.released.get(seq_id, 0)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out: empty ones plus cached ones nobody uses (evictable)."""
        return len(self.free_ids) + len(self.cached_free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, token_ids: list[int], max_hits: int | None = None) -> list[int | None]:
        """Block ids of the longest cached run of full blocks (at most `max_hits`) at the start of
        `token_ids`, leaving at least one token to compute (its logits are needed). With a sliding
        window, the blocks wholly behind the first new token's window need not be cached: None
        stands for them."""
        if not self.enable_prefix_caching:
            return []
        found, prev = [], None
        for i in range((len(token_ids) - 1) // self.block_size):  # all cached: the last block is recomputed
            prev = hash_block(prev, token_ids[i * self.block_size:(i + 1) * self.block_size])
            found.append(self.hash_to_block.get(prev))
            if found[-1] is None and self.window is None:
                break
        n = self.usable_hits(found, len(found) if max_hits is None else max_hits)
        if self.prefix_limit is not None and n:
            n = self.usable_hits(found, self.prefix_limit(token_ids, n * self.block_size) // self.block_size)
        return [None] * self.behind_window(n) + found[self.behind_window(n):n]

    def usable_hits(self, found: list[int | None], most: int) -> int:
        """The most leading blocks (at most `most`) a prompt may take from `found` (its blocks'
        cached ids, None where not cached): every block its first new token can see is cached."""
        n = min(most, len(found))
        while n and None in found[self.behind_window(n):n]:
            n -= 1
        return n

    def behind_window(self, num_blocks: int) -> int:
        """Leading blocks that no token from position num_blocks * block_size on can see; never
        the last of the num_blocks (it is taken whatever the window: its hash names the prefix)."""
        if self.window is None:
            return 0
        return min(max(0, num_blocks - 1), max(0, num_blocks * self.block_size - self.window + 1) // self.block_size)

    def can_allocate(self, token_ids: list[int], budget: int | None = None, max_hits: int | None = None) -> bool:
        """Would `allocate` succeed now? (Cached blocks in use by others cost nothing.)"""
        hits = self.cached_prefix(token_ids, max_hits)
        shared = sum(1 for b in hits if b is None or self.blocks[b].ref_count > 0)
        return self._prompt_blocks(token_ids, len(hits), budget) - shared <= self.num_free_blocks

    def _prompt_blocks(self, token_ids: list[int], hits: int, budget: int | None) -> int:
        """The blocks a new prompt takes now: all of them; with a window and a step's token
        `budget`, the hits and the blocks of the next `budget` tokens (the rest come later)."""
        tokens = len(token_ids) if self.window is None or budget is None else \
            min(len(token_ids), hits * self.block_size + budget)
        return self.blocks_needed(tokens)

    # ---- changes ------------------------------------------------------------------------
    def allocate(self, seq_id: int, token_ids: list[int], budget: int | None = None,
                 max_hits: int | None = None) -> int:
        """Give `seq_id` blocks for its prompt, reusing cached ones (with a window and a `budget`:
        for the tokens the next step can compute). Returns the number of prompt tokens whose K/V
        are already in the cache (to be skipped by prefill)."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        if self._prompt_blocks(token_ids, 0, budget) > self.num_blocks:
            raise NoFreeBlocksError(f"a {len(token_ids)}-token sequence needs {self.blocks_needed(len(token_ids))} "
                                    f"blocks of {self.block_size}; the whole pool has {self.num_blocks}")
        if not self.can_allocate(token_ids, budget, max_hits):
            raise NoFreeBlocksError(f"not enough free KV blocks now ({self.num_free_blocks} free)")
        hits = self.cached_prefix(token_ids, max_hits)
        behind = hits.count(None)
        for b in hits[behind:]:
            self._take(b)
        fresh = [self._take_free() for _ in range(self._prompt_blocks(token_ids, len(hits), budget) - len(hits))]
        self.tables[seq_id] = [0] * behind + hits[behind:] + fresh  # entries behind the window: never read
        if behind:
            self.released[seq_id] = behind
        self.hashed[seq_id] = (len(hits), self.blocks[hits[-1]].block_hash if hits else None)
        self.prefix_hit_tokens += len(hits) * self.block_size
        self.prompt_tokens += len(token_ids)
        return len(hits) * self.block_size

    def append_slot(self, seq_id: int, num_tokens: int) -> None:
        """Make room for the sequence to hold `num_tokens` tokens (one more block when the
        last is full). Raises NoFreeBlocksError, changing nothing, when the pool is empty."""
        table = self.tables[seq_id]
        missing = self.blocks_needed(num_tokens) - len(table)
        if missing > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id} needs {missing} more block(s); none free")
        table.extend(self._take_free() for _ in range(missing))

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shrink the sequence to its first `num_tokens` tokens, freeing the blocks past them.
        Speculative decoding writes K/V for drafts before knowing which survive; the rejected
        ones are rolled back here. Only uncommitted tokens can go: a named (hashed) block may
        already be shared, so it is never cut."""
        named = self.hashed[seq_id][0]
        if num_tokens < named * self.block_size:
            raise ValueError(f"cannot truncate sequence {seq_id} to {num_tokens} tokens: its first "
                             f"{named * self.block_size} are committed (prefix-cached)")
        table = self.tables[seq_id]
        for b in table[self.blocks_needed(num_tokens):]:  # private blocks: never named, never shared
            self.blocks[b].ref_count = 0
            self.free_ids.append(b)
        del table[self.blocks_needed(num_tokens):]

    def commit(self, seq_id: int, token_ids: list[int], num_tokens: int | None = None) -> None:
        """The first `num_tokens` of `token_ids` (default: all) now have K/V in the cache: name
        each newly full block by its hash so later requests can reuse it. (A count, so an engine
        passes a sequence's whole id buffer instead of copying its computed prefix.) With a sliding
        window, the blocks now wholly behind it are released."""
        num_tokens = len(token_ids) if num_tokens is None else num_tokens
        if self.enable_prefix_caching:
            self._name_full_blocks(seq_id, token_ids, num_tokens)
        if self.window is not None:
            self._release_behind_window(seq_id, num_tokens)

    def _name_full_blocks(self, seq_id: int, token_ids, num_tokens: int) -> None:
        table = self.tables[seq_id]
        done, prev = self.hashed[seq_id]
        for i in range(done, num_tokens // self.block_size):
            prev = hash_block(prev, token_ids[i * self.block_size:(i + 1) * self.block_size])
            block = self.blocks[table[i]]
            if prev not in self.hash_to_block:  # an identical block computed twice keeps one name
                block.block_hash = prev
                self.hash_to_block[prev] = block.block_id
            self.hashed[seq_id] = (i + 1, prev)

    def _release_behind_window(self, seq_id: int, num_tokens: int) -> None:
        """Every query still to come sits at a position >= num_tokens (a rollback never goes below
        the computed length) and sees keys from its position - window + 1 on: a block whose last
        position is below num_tokens - window + 1 is never read again."""
        table, done = self.tables[seq_id], self.released.get(seq_id, 0)
        dead = min(max(0, (num_tokens - self.window + 1) // self.block_size), len(table))
        for b in table[done:dead]:
            self._release(b)
        self.released[seq_id] = max(done, dead)

    def fork(self, parent_id: int, child_id: int) -> list[tuple[int, int]]:
        """The child shares the parent's full blocks; its partial last block is a private
        copy. Returns [(src, dst)] block copies the caller must make in the K/V pool."""
        table = self.tables[parent_id]
        partial = self.hashed[parent_id][0] < len(table)  # the last block may still be written
        shared = table[:-1] if partial else list(table)
        if partial and self.num_free_blocks < 1:
            raise NoFreeBlocksError("no free block for the forked sequence's last block")
        released = self.released.get(parent_id, 0)  # behind the window: not held, not taken
        for b in shared[released:]:
            self._take(b)
        copies = []
        if partial:
            dst = self._take_free()
            copies.append((table[-1], dst))
            shared = shared + [dst]
        self.tables[child_id] = shared
        self.hashed[child_id] = self.hashed[parent_id]
        if released:
            self.released[child_id] = released
        return copies

    def free(self, seq_id: int) -> None:
        """Release a sequence's blocks. Hashed blocks stay cached; the tail is freed first so
        that eviction takes the ends of prefixes before their beginnings."""
        table, released = self.tables.pop(seq_id), self.released.pop(seq_id, 0)
        for b in reversed(table[released:]):
            self._release(b)
        del self.hashed[seq_id]

    # ---- internals ----------------------------------------------------------------------
    def _release(self, b: int) -> None:
        block = self.blocks[b]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is not None:
                self.cached_free[block.block_hash] = b
            else:
                self.free_ids.append(b)

    def _take(self, b: int) -> None:
        block = self.blocks[b]
        if block.ref_count == 0:
            del self.cached_free[block.block_hash]
        block.ref_count += 1

    def _take_free(self) -> int:
        if self.free_ids:
            b = self.free_ids.popleft()
        else:  # evict the least recently freed cached block
            _, b = self.cached_free.popitem(last=False)
            del self.hash_to_block[self.blocks[b].block_hash]
            self.blocks[b].block_hash = None
        self.blocks[b].ref_count = 1
        return b
