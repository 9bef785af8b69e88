"""Exercise: attention over the paged pool in PyTorch without a host sync, as a CUDA graph needs it.
Fill in the two bodies below, then run

    pytest stages/06_kernels_graphs/tests/test_torch_backend.py --exercise

`--exercise` (root conftest.py) puts this code in place of the reference in
`course.s06_kernels_graphs.torch_backend`, where `TorchPagedBackend.forward` calls it (every
captured or decode step writes its K/V with the method, then decode steps attend with the
function), and it runs in that module's namespace (`torch`). Without the flag the tests run the
reference. Read `torch_backend.py`'s module docstring first; its code is the answer, so try
before you look.
"""
from __future__ import annotations

import torch  # noqa: F401  (what a solution may need)

from course.s06_kernels_graphs.backend_base import KernelMetadata


class TorchPagedBackend:
    def write_kv(self, layer, k, v, meta: KernelMetadata):
        """k, v: [T, Hkv, D], this step's new keys and values; meta.slot_mapping [T]: where each
        goes, block * block_size + offset. Write them into layer `layer`'s pools (`self.cache.k[layer]`,
        `self.cache.v[layer]`, [num_blocks, block_size, Hkv, D]) and return the two pools.

        No host sync: view each pool as [num_blocks * block_size, Hkv, D] (a view, no copy) and
        index-put the rows at the slots, one scatter per pool."""
        raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/torch_backend.py "
                                  "TorchPagedBackend.write_kv")


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens, window: int | None = None, sinks=None):
    """q: [B, H, D], one query per sequence at position seq_len-1; pools [num_blocks, bs, Hkv, D];
    block_tables [B, W]; seq_lens [B]. Returns [B, H, D] in q's dtype.

    No host sync (a CUDA graph must capture it): every shape comes from the table's width W,
    the lengths only enter through a mask. Gather every table's blocks at once
    (`k_pool[block_tables]` -> [B, W, bs, Hkv, D], flattened to [B, W*bs, Hkv, D]); group the
    H query heads by their KV head ([B, Hkv, H/Hkv, D]: grouped-query attention without copying
    K/V per query head); scores in float32 scaled by D**-0.5 (einsum); -inf where the key index
    >= the sequence's length (and, with a `window`, < length - window); softmax over keys
    (`softmax_with_sinks` with `sinks` [H] viewed as [1, Hkv, H/Hkv, 1]); weight the values;
    back to [B, H, D]."""
    raise NotImplementedError("exercise: stages/06_kernels_graphs/exercises/torch_backend.py decode_attention_gather")
