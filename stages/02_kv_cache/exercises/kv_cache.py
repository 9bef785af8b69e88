"""Exercise: the contiguous KV cache. Fill in the two bodies below, then run

    pytest stages/02_kv_cache --exercise

`--exercise` (root conftest.py) puts these methods onto the reference classes in
`course.s02_kv_cache.kv_cache`, in that module's namespace (`causal_attention`,
`CacheCapacityError`, `AttentionMetadata` are there): `self` has the reference's fields
(`self.k`, `self.v`: [layers, capacity, n_kv_heads, head_dim]; `self.capacity`;
`self.num_tokens`; the backend's `self.cache`). Without the flag the tests run the reference.
Read `kv_cache.py`'s docstrings first; its code is the answer, so try before you look.
"""
from __future__ import annotations

import torch

from course.s01_decode_loop.attention import AttentionMetadata


class KVCache:
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's k, v ([T, n_kv_heads, head_dim]) for `layer` at positions
        start .. start+T-1. Past the capacity: raise CacheCapacityError *before* writing anything.
        After the last layer's write, `num_tokens` is start+T (every layer then agrees)."""
        raise NotImplementedError("exercise: stages/02_kv_cache/exercises/kv_cache.py KVCache.write")


class ContiguousKVAttention:
    def forward(self, layer, q, k, v, meta: AttentionMetadata, sinks=None):
        """One sequence per forward (ValueError otherwise). The new tokens are the last
        q.shape[0] of a sequence of `meta.seq_lens[0]` tokens: append their k, v to the cache at
        the right start, then attend q over the whole cached prefix (stage 01's
        `causal_attention`, with `q_start` = the number of positions cached before this step,
        and the layer's `window=self.window(layer)` and `sinks`)."""
        raise NotImplementedError("exercise: stages/02_kv_cache/exercises/kv_cache.py ContiguousKVAttention.forward")
