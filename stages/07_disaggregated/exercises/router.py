"""Exercise: what a cache-aware router remembers about each worker. Fill in the three bodies
below, then run

    pytest stages/07_disaggregated/tests/test_router.py --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s07_disaggregated.router` (methods onto the reference `PrefixTree`, so `self` has
`block_size`, `max_blocks` and `nodes`, an OrderedDict hash -> parent hash, least recently used
first), and they run in that module's namespace (`hash_block`, `OrderedDict`, `Sequence`).
`Router.choose` calls them for every request. Without the flag the tests run the reference.
Read `router.py`'s module docstring first; its code is the answer, so try before you look.
"""
from __future__ import annotations

from collections.abc import Sequence

from course.s03_paged.block_manager import hash_block  # noqa: F401  (what a solution may need)


def prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hash (stage 03's `hash_block(prev, tokens)`, prev None for the first block)
    of every *full* block of `token_ids`, in order; a partial last block gets none (a prefix
    cache never shares it)."""
    raise NotImplementedError("exercise: stages/07_disaggregated/exercises/router.py prefix_block_hashes")


class PrefixTree:
    def match_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the prompt (`hashes`, from prefix_block_hashes) this worker
        has seen. A chained hash names its whole prefix, so stop at the first miss."""
        raise NotImplementedError("exercise: stages/07_disaggregated/exercises/router.py PrefixTree.match_blocks")

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Remember a prompt (or refresh it), then forget the least recently used blocks.

        Each node maps its hash to its parent's (None for the first block). Touch the path leaf
        first and root last (set the node, `move_to_end`), so a parent is always more recently
        used than its children: the least recently used node is then always a leaf, and popping
        from the front (`popitem(last=False)`) while there are more than `self.max_blocks`
        nodes never orphans a subtree."""
        raise NotImplementedError("exercise: stages/07_disaggregated/exercises/router.py PrefixTree.insert")
