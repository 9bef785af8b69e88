"""Exercise: the heart of the block manager. Fill in the three bodies below, then run

    pytest stages/03_paged --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s03_paged.block_manager`, and they run in that module's namespace (every name it defines
or imports is yours to use). Methods go onto the reference `BlockManager` class, so `self` has
every other method and field: `self.blocks`, `self.free_ids`, `self.cached_free`,
`self.hash_to_block`, `self.tables`, `self.hashed`, `self.released`, `cached_prefix`,
`can_allocate`, `blocks_needed`, `_prompt_blocks`, `_take`, `_take_free`. Without the flag the
tests run the reference.
Read `block_manager.py`'s module docstring first; its code is the answer, so try before you look.
"""
from __future__ import annotations

from array import array  # noqa: F401  (what a solution may need)
from hashlib import blake2b  # noqa: F401

from course.s03_paged.block_manager import NoFreeBlocksError  # noqa: F401


def hash_block(prev_hash: bytes | None, token_ids) -> bytes:
    """Chained block hash: equal hashes mean the same tokens *and* the same prefix before them.

    Hash the previous block's hash (b"" for the first block) followed by the block's token ids
    as signed 64-bit integers (`array("q", token_ids).tobytes()`), with 16-byte blake2b."""
    raise NotImplementedError("exercise: stages/03_paged/exercises/block_manager.py hash_block")


class BlockManager:
    def allocate(self, seq_id: int, token_ids: list[int], budget: int | None = None,
                 max_hits: int | None = None) -> int:
        """Give `seq_id` blocks for its prompt, reusing cached ones (with a window and a `budget`:
        for the tokens the next step can compute). Returns the number of prompt tokens whose K/V
        are already in the cache (to be skipped by prefill).

        * ValueError if `seq_id` already has blocks; NoFreeBlocksError, changing nothing, if the
          prompt needs more blocks than the whole pool (`_prompt_blocks(token_ids, 0, budget)`),
          or than are free now (`can_allocate(token_ids, budget, max_hits)`);
        * hits = `cached_prefix(token_ids, max_hits)`: its leading Nones are blocks behind a
          sliding window, not needed; take every other block of it (`_take`), then fresh ones
          (`_take_free`) until the table has `_prompt_blocks(token_ids, len(hits), budget)`;
        * record the table in `self.tables[seq_id]` (block 0 for each None: never read), the
          number of Nones in `self.released[seq_id]` (when there are any), and, in
          `self.hashed[seq_id]`, how many of its blocks are named and the last name
          (`(len(hits), hash of the last hit or None)`);
        * count `prefix_hit_tokens` and `prompt_tokens` (statistics the tests read)."""
        raise NotImplementedError("exercise: stages/03_paged/exercises/block_manager.py BlockManager.allocate")

    def free(self, seq_id: int) -> None:
        """Release a sequence's blocks. Hashed blocks stay cached; the tail is freed first so
        that eviction takes the ends of prefixes before their beginnings.

        Drop one reference from each block, last block first; a block nobody references any more
        goes to `self.cached_free` (keyed by its hash) if it is named, else back to
        `self.free_ids` (`self._release(b)` does that for one block). Forget `self.tables[seq_id]`
        and `self.hashed[seq_id]`. A sliding-window sequence already released its first
        `self.released.get(seq_id, 0)` blocks: skip them, and forget its entry there too."""
        raise NotImplementedError("exercise: stages/03_paged/exercises/block_manager.py BlockManager.free")
