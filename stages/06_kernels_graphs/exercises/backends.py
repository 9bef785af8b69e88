"""Exercise: attention over the paged pool in PyTorch, the two ways the torch backend needs.
Fill in the two bodies below, then run

    pytest stages/06_kernels_graphs/tests/test_torch_backend.py --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s06_kernels_graphs.backends`, where `TorchPagedBackend.forward` calls them (captured
decode steps call the first; planned eager steps call the second for each prefill chunk), and
they run in that module's namespace (`torch`, `F`). Without the flag the tests run the
reference. Read `backends.py`'s module docstring first; its code is the answer, so try before
you look.
"""
from __future__ import annotations

import torch  # noqa: F401  (what a solution may need)
import torch.nn.functional as F  # noqa: F401


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens):
    """q: [B, H, D], one query per sequence at position seq_len-1; pools [num_blocks, bs, Hkv, D];
    block_tables [B, W]; seq_lens [B]. Returns [B, H, D] in q's dtype.

    No host sync (a CUDA graph must capture it): every shape comes from the table's width W,
    the lengths only enter through a mask. Gather every table's blocks at once
    (`k_pool[block_tables]` -> [B, W, bs, Hkv, D], flattened to [B, W*bs, Hkv, D]); group the
    H query heads by their KV head ([B, Hkv, H/Hkv, D]: grouped-query attention without copying
    K/V per query head); scores in float32 scaled by D**-0.5 (einsum); -inf where the key index
    >= the sequence's length; softmax over keys; weight the values; back to [B, H, D]."""
    raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/backends.py decode_attention_gather")


def causal_attention_sdpa(q, k, v, q_start: int):
    """Stage 01's causal_attention through torch's fused SDPA: q [Tq, H, D] at positions
    q_start .. q_start+Tq-1 (a prefill chunk after q_start cached tokens), k/v [Tk, Hkv, D] at
    positions 0 .. Tk-1. Returns [Tq, H, D].

    Build the boolean mask `allowed` [Tq, Tk]: key j is visible to query i when j <= q_start + i.
    SDPA wants heads first ([H, T, D]) and takes grouped KV heads with `enable_gqa=True`."""
    raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/backends.py causal_attention_sdpa")
