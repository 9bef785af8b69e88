"""A contiguous K/V cache for one sequence, and the attention backend that uses it.

Attention at position p needs the keys and values of positions 0..p. They never change once
computed (RoPE rotated the keys by their own, fixed position), so we compute them once and
keep them: that is the whole trick. The price is memory, reserved up front for the longest
the request may grow (prompt + max_new_tokens): stage 03 will stop reserving what is unused.
"""
from __future__ import annotations

import torch

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata, causal_attention
from course.s01_decode_loop.config import ModelConfig


class CacheCapacityError(ValueError):
    """The request cannot fit in the cache; raised before any compute is spent on it."""


class KVCache:
    """K and V for every layer: [layers, capacity, n_kv_heads, head_dim] each. GQA-aware: it
    stores n_kv_heads, not n_heads, which is why GQA models have small caches."""

    def __init__(self, config: ModelConfig, capacity: int, dtype=torch.float32, device="cpu"):
        shape = (config.num_hidden_layers, capacity, config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.windows = config.layer_windows  # a sliding layer still stores every position; attention masks
        self.num_tokens = 0  # how many positions hold valid K/V (all layers agree after a forward)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[0]
        if end > self.capacity:
            raise CacheCapacityError(f"KV cache full: writing positions {start}..{end - 1} "
                                     f"into a cache of {self.capacity} positions")
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        if layer == self.k.shape[0] - 1:
            self.num_tokens = end


class ContiguousKVAttention(AttentionBackend):
    """Stage 02's backend: append this step's K/V to the cache, attend over the whole prefix.

    One sequence per forward (batching comes in stage 04). The new tokens are the last
    query_len positions of a sequence of seq_lens[0] tokens: the whole prompt at prefill,
    a single token at decode. A sliding-window layer attends over its last `window` positions.
    """
    takes_sinks = True

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.windows = cache.windows

    def forward(self, layer, q, k, v, meta: AttentionMetadata, sinks=None):
        if meta.num_seqs != 1:
            raise ValueError("ContiguousKVAttention serves one sequence at a time")
        total = int(meta.seq_lens[0])
        start = total - q.shape[0]  # positions already cached before this step
        self.cache.write(layer, start, k, v)
        return causal_attention(q, self.cache.k[layer, :total], self.cache.v[layer, :total], q_start=start,
                                window=self.window(layer), sinks=sinks)
