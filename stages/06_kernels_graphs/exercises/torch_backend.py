"""Exercise: attention over the paged pool in PyTorch without a host sync, as a CUDA graph needs it.
Fill in the two bodies below, then run

    pytest stages/06_kernels_graphs/tests/test_torch_backend.py --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s06_kernels_graphs.torch_backend`, where `TorchPagedBackend.forward` calls them (decode
steps call the first; captured steps with prefill chunks or verifications the second), and
they run in that module's namespace (`torch`). Without the flag the tests run the
reference. Read `torch_backend.py`'s module docstring first; its code is the answer, so try
before you look.
"""
from __future__ import annotations

import torch  # noqa: F401  (what a solution may need)


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens):
    """q: [B, H, D], one query per sequence at position seq_len-1; pools [num_blocks, bs, Hkv, D];
    block_tables [B, W]; seq_lens [B]. Returns [B, H, D] in q's dtype.

    No host sync (a CUDA graph must capture it): every shape comes from the table's width W,
    the lengths only enter through a mask. Gather every table's blocks at once
    (`k_pool[block_tables]` -> [B, W, bs, Hkv, D], flattened to [B, W*bs, Hkv, D]); group the
    H query heads by their KV head ([B, Hkv, H/Hkv, D]: grouped-query attention without copying
    K/V per query head); scores in float32 scaled by D**-0.5 (einsum); -inf where the key index
    >= the sequence's length; softmax over keys; weight the values; back to [B, H, D]."""
    raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/torch_backend.py decode_attention_gather")


def varlen_attention_gather(q, k_pool, v_pool, cu_seqlens_q, positions, block_tables, seq_lens):
    """The same for a ragged step (prefill chunks beside decodes): q [T, H, D], rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of sequence b, at `positions` [T]; block_tables [B, W];
    seq_lens [B]. Returns [T, H, D] in q's dtype; rows of no sequence (bucket padding past
    cu_seqlens_q[-1]) come out as zeros.

    Still no host sync: find each row's sequence on the device (`torch.searchsorted` of the row
    index in cu_seqlens_q[1:], `right=True`), clamp it for the padding rows, and gather each ROW's
    table ([T, W*bs, Hkv, D]). A key is visible to a row when its index is <= the row's position,
    < its sequence's length, and the row belongs to a sequence. Mask the scores with -inf where
    invisible; a row that sees nothing must give 0, not NaN (`torch.where` after the softmax)."""
    raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/torch_backend.py varlen_attention_gather")
