"""The step-input builder every runner uses, against a plain per-token reference on ragged
batches: prefill chunks over a cached prefix, decodes, a verification, and a decode bucket's
padding sequences into the dummy block."""
import pytest
import torch

from course.s06_kernels_graphs.step_inputs import StepBuffers, step_inputs

BS, DUMMY = 4, 99


def reference(seqs, width):
    """Token by token: a sequence's slots are its blocks' slots in table order; table padding
    points at the dummy block."""
    positions, slots, cu, tables = [], [], [0], []
    for cached, new, table in seqs:
        table = (table + [DUMMY] * width)[:width]
        every_slot = [block * BS + offset for block in table for offset in range(BS)]
        for position in range(cached, cached + new):
            positions.append(position)
            slots.append(every_slot[position])
        cu.append(len(positions))
        tables += table
    return positions, slots, cu, [c + n for c, n, _ in seqs], tables


STEPS = {
    "chunk over a cached prefix + decodes": [(6, 5, [3, 8, 1]), (9, 1, [4, 0, 7]), (0, 1, [5])],
    "a whole prompt + a verification": [(0, 9, [2, 6, 11]), (5, 4, [9, 10, 12])],
    "decodes at block edges": [(3, 1, [1]), (4, 1, [2, 7]), (7, 1, [13, 14])],
    "tables longer than needed": [(1, 1, [6, 2, 3, 4]), (0, 2, [8, 9])],
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_eager_steps_flatten_like_the_reference(name):
    seqs = STEPS[name]
    got = step_inputs(seqs, BS, DUMMY)
    width = max(-(-(c + n) // BS) for c, n, _ in seqs)
    assert got.width == width
    assert (got.positions, got.slot_mapping, got.cu_seqlens_q, got.seq_lens, got.block_tables) == reference(seqs, width)
    assert got.query_lens == [n for _, n, _ in seqs]


def test_a_decode_bucket_pads_with_one_token_sequences_into_the_dummy_block():
    seqs = STEPS["decodes at block edges"] + [(0, 1, [])] * 5  # 3 decodes in bucket 8
    got = step_inputs(seqs, BS, DUMMY, width=6)
    assert (got.positions, got.slot_mapping, got.cu_seqlens_q, got.seq_lens, got.block_tables) == reference(seqs, 6)
    assert got.slot_mapping[3:] == [DUMMY * BS] * 5 and got.block_tables[3 * 6:] == [DUMMY] * 30
    assert got.seq_lens[3:] == [1] * 5  # each padding row attends to its own key alone


def test_buffers_start_as_an_empty_step_any_bucket_can_be_captured_on():
    """Graphs are captured before the first step: with more sequence slots (20) than rows (16), a
    kernel must find no sequence owning a row, and every row's K/V going to the dummy block."""
    views = StepBuffers(16, 20, 3, DUMMY, BS, "cpu").views(16, 20, 3)
    assert views["cu_seqlens_q"].eq(0).all()
    assert views["slot_mapping"].eq(DUMMY * BS).all() and views["block_tables"].eq(DUMMY).all()
    buffers = StepBuffers(16, 20, 3, DUMMY, BS, "cpu")
    buffers.fill([5, 6], step_inputs([(4, 2, [1, 2])], BS, DUMMY, width=3))
    assert buffers.cu_seqlens_q[:2].tolist() == [0, 2] and torch.equal(buffers.input_ids[:2], torch.tensor([5, 6]))
