"""Property-based tests of the BlockManager: whatever the interleaving of allocate, append,
fork and free, no block leaks or is freed twice, reference counts equal the number of live
users, and once everything is freed the pool is whole again."""
import copy
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.s03_paged.block_manager import BlockManager, NoFreeBlocksError, hash_block

BS = 4
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=14)  # tiny alphabet: prefixes collide often


def snapshot(bm: BlockManager):
    return copy.deepcopy((bm.blocks, list(bm.free_ids), list(bm.cached_free.items()), bm.hash_to_block,
                          bm.tables, bm.hashed, bm.released))


def held(bm: BlockManager, sid: int) -> list[int]:
    """The blocks a sequence holds: its table, less those released behind a sliding window."""
    return bm.tables[sid][bm.released.get(sid, 0):]


class BlockManagerMachine(RuleBasedStateMachine):
    window = None

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=BS, window=self.window)
        self.seqs: dict[int, list[int]] = {}  # seq_id -> its tokens (all computed)
        self.next_id = 0

    @rule(prompt=tokens)
    def allocate(self, prompt):
        before = snapshot(self.bm)
        try:
            cached = self.bm.allocate(self.next_id, prompt)
        except NoFreeBlocksError:
            assert snapshot(self.bm) == before, "a refused allocation changed the pool"
            return
        assert cached % BS == 0 and cached < len(prompt)
        self.bm.commit(self.next_id, prompt)
        self.seqs[self.next_id] = list(prompt)
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def append(self, data, new):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        before = snapshot(self.bm)
        try:
            self.bm.append_slot(sid, len(self.seqs[sid]) + len(new))
        except NoFreeBlocksError:
            assert snapshot(self.bm) == before, "a refused append changed the pool"
            return
        self.seqs[sid] += new
        self.bm.commit(sid, self.seqs[sid])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), drafts=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def speculate(self, data, drafts):
        """Room for k drafted tokens, then keep the first `accepted`: the rest roll back."""
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        accepted = data.draw(st.integers(0, len(drafts)))
        try:
            self.bm.append_slot(sid, len(self.seqs[sid]) + len(drafts))
        except NoFreeBlocksError:
            return
        self.seqs[sid] += drafts[:accepted]
        self.bm.truncate(sid, len(self.seqs[sid]))
        self.bm.commit(sid, self.seqs[sid])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        before = snapshot(self.bm)
        try:
            copies = self.bm.fork(sid, self.next_id)
        except NoFreeBlocksError:
            assert snapshot(self.bm) == before
            return
        parent, child = self.bm.tables[sid], self.bm.tables[self.next_id]
        assert len(child) == len(parent) and all(dst not in held(self.bm, sid) for _, dst in copies)
        assert held(self.bm, self.next_id)[:-1] == held(self.bm, sid)[:-1]  # shared, behind the window too
        self.seqs[self.next_id] = list(self.seqs[sid])
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.bm.free(sid)
        del self.seqs[sid]

    @invariant()
    def ref_counts_equal_live_users(self):
        users = Counter(b for sid in self.bm.tables for b in held(self.bm, sid))
        assert all(blk.ref_count == users[blk.block_id] for blk in self.bm.blocks)

    @invariant()
    def every_block_is_in_exactly_one_place(self):
        free = list(self.bm.free_ids) + list(self.bm.cached_free.values())
        assert len(free) == len(set(free)), "a block is free twice"
        used = {b for sid in self.bm.tables for b in held(self.bm, sid)}
        assert not used & set(free), "a used block is also free"
        assert used | set(free) == set(range(self.bm.num_blocks)), "a block leaked"

    @invariant()
    def hashes_name_their_blocks(self):
        for h, b in self.bm.hash_to_block.items():
            assert self.bm.blocks[b].block_hash == h
        for h, b in self.bm.cached_free.items():
            assert self.bm.hash_to_block[h] == b and self.bm.blocks[b].ref_count == 0

    @invariant()
    def tables_cover_their_tokens(self):
        for sid, toks in self.seqs.items():
            assert len(self.bm.tables[sid]) == -(-len(toks) // BS)

    @invariant()
    def a_window_holds_only_what_it_still_reads(self):
        """Every block holding a position the next query (at len(toks)) can see is held; with a
        window, no more than window / block_size + 2 blocks are."""
        for sid, toks in self.seqs.items():
            first_seen = max(0, len(toks) - self.window + 1) if self.window else 0
            assert self.bm.released.get(sid, 0) <= first_seen // BS
            if self.window:
                assert len(held(self.bm, sid)) <= self.window // BS + 2

    def teardown(self):
        for sid in list(self.seqs):
            self.bm.free(sid)
        assert self.bm.num_free_blocks == self.bm.num_blocks and not self.bm.tables


TestBlockManagerProperties = BlockManagerMachine.TestCase
TestBlockManagerProperties.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


class WindowedBlockManagerMachine(BlockManagerMachine):
    window = 5  # every layer slides over 5 positions: blocks behind it are released as sequences pass


TestBlockManagerPropertiesWithAWindow = WindowedBlockManagerMachine.TestCase
TestBlockManagerPropertiesWithAWindow.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_block_manager_prefix_hits_reuse_full_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = list(range(10))  # blocks [0-3] [4-7] [8,9]
    bm.allocate(0, a)
    bm.commit(0, a)
    b = a[:9] + [99, 98]  # same first two full blocks
    assert bm.allocate(1, b) == 8
    assert bm.tables[1][:2] == bm.tables[0][:2] and bm.tables[1][2] != bm.tables[0][2]
    assert [bm.blocks[i].ref_count for i in bm.tables[0][:2]] == [2, 2]


def test_block_manager_commit_of_a_count_equals_commit_of_the_prefix():
    """commit(id, ids, n) names the same blocks as commit(id, ids[:n]): an engine passes its
    sequence's whole id buffer and how many have K/V."""
    ids = list(range(30))
    by_count, by_prefix = BlockManager(num_blocks=8, block_size=4), BlockManager(num_blocks=8, block_size=4)
    for bm in (by_count, by_prefix):
        bm.allocate(0, ids)
    for n in (3, 9, 16, 30):
        by_count.commit(0, ids, n)
        by_prefix.commit(0, ids[:n])
        assert by_count.hashed == by_prefix.hashed and by_count.hash_to_block == by_prefix.hash_to_block


def test_block_manager_fully_cached_prompt_recomputes_last_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = list(range(8))
    bm.allocate(0, a)
    bm.commit(0, a)
    bm.free(0)
    assert bm.allocate(1, a) == 4  # one block reused, the last recomputed for its logits


def test_block_manager_evicts_least_recently_freed_first():
    bm = BlockManager(num_blocks=3, block_size=2)
    for sid, prompt in enumerate([[1, 1, 0], [2, 2, 0]]):
        bm.allocate(sid, prompt)
        bm.commit(sid, prompt)
        bm.free(sid)
    assert len(bm.cached_free) == 2
    bm.allocate(5, [7, 7, 7, 7, 0])  # 3 blocks: the free one, then evict [1,1], then [2,2]
    assert not bm.cached_free and hash_block(None, [1, 1]) not in bm.hash_to_block


def test_block_manager_refuses_what_never_fits_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    before = snapshot(bm)
    with pytest.raises(NoFreeBlocksError, match="needs 3 blocks of 4; the whole pool has 2"):
        bm.allocate(0, list(range(9)))
    assert snapshot(bm) == before


def test_block_manager_truncate_frees_draft_blocks_and_refuses_committed_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate(0, list(range(6)))
    bm.commit(0, list(range(6)))  # block 0 named; block 1 holds 2 tokens
    bm.append_slot(0, 6 + 7)  # room for 7 drafts: 4 blocks
    assert len(bm.tables[0]) == 4 and bm.num_free_blocks == 4
    bm.truncate(0, 6 + 2)  # two drafts accepted: back to 2 blocks
    assert len(bm.tables[0]) == 2 and bm.num_free_blocks == 6
    with pytest.raises(ValueError, match="committed"):
        bm.truncate(0, 3)
