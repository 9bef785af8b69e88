"""The PyTorch backend: stage 03's math on the paged pool, the reference every kernel is held to.

* Captured decode steps (graph_runner.py builds their metadata, with no host lengths): every
  sequence's table is gathered at once and masked past its length. More bytes than needed,
  but fixed shapes and no host sync, so a CUDA graph can capture it (`decode_attention_gather`).
  Captured steps with prefill chunks take a room's attention (`register_captured_varlen`).
* Eager steps: decodes the same way; prefill chunks through stage 03's `PagedAttention`,
  sequence by sequence (a gather of every row's keys would be T x L).
"""
from __future__ import annotations

from typing import Callable

import torch

from course.s01_decode_loop.attention import softmax_with_sinks
from course.s03_paged.paged_attention import PagedAttention, PagedKVCache

from .backend_base import KernelBackend, KernelMetadata


class TorchPagedBackend(KernelBackend):
    name = "torch"
    serves_windows = takes_sinks = True
    captured_varlen: Callable | None = None  # a captured step's ragged attention, a room's (mixed_graphs/)

    def __init__(self, cache: PagedKVCache):
        super().__init__(cache)
        self.reference = PagedAttention(cache)

    def write_kv(self, layer, k, v, meta: KernelMetadata):
        """The step's new K/V into the layer's pool at their slots; returns the pools."""
        self.cache.write(layer, meta.slot_mapping, k, v)
        return self.cache.pools(layer)  # [num_blocks, bs, Hkv, D] each (quantized: dequantized where read)

    def forward(self, layer, q, k, v, meta: KernelMetadata, sinks=None):
        if not meta.is_decode and not meta.graphed:  # eager prefill chunks: stage 03's path
            return self.reference.forward(layer, q, k, v, meta, sinks=sinks)
        k_pool, v_pool = self.write_kv(layer, k, v, meta)
        if meta.is_decode:
            return decode_attention_gather(q, k_pool, v_pool, meta.block_tables, meta.seq_lens, self.window(layer), sinks)
        if sinks is not None:
            raise ValueError("attention sinks in a captured step with prefill chunks are not implemented")
        return self.captured_varlen(q, k_pool, v_pool, meta.cu_seqlens_q, meta.positions, meta.block_tables,
                                    meta.seq_lens, self.window(layer))


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens, window: int | None = None, sinks=None):
    """q: [B, H, D], one query per sequence at position seq_len-1. Sync-free: every shape comes
    from the block table's width, the lengths only enter through a mask. Table padding must
    hold valid block ids (the runner pads with its dummy block); the pool holds finite values.
    A sliding layer's `window` masks the keys before its last `window` positions too; `sinks`
    [H] joins each head's softmax as one more logit with no value (stage 01's causal_attention)."""
    b, h, d = q.shape
    kv_heads = k_pool.shape[2]
    keys = k_pool[block_tables].flatten(1, 2)  # [B, W*bs, Hkv, D]
    values = v_pool[block_tables].flatten(1, 2)
    qg = q.float().view(b, kv_heads, h // kv_heads, d)  # GQA: query heads grouped by their KV head
    scores = torch.einsum("bngd,blnd->bngl", qg, keys.float()) * d ** -0.5
    span = torch.arange(keys.shape[1], device=q.device)[None, :]
    hidden = span >= seq_lens[:, None]  # [B, L]: past the end
    if window is not None:
        hidden |= span < seq_lens[:, None] - window  # before the window
    scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
    probs = softmax_with_sinks(scores, None if sinks is None else sinks.float().view(1, kv_heads, -1, 1))
    out = torch.einsum("bngl,blnd->bngd", probs, values.float())
    return out.reshape(b, h, d).to(q.dtype)


def register_captured_varlen(kernel: Callable) -> None:
    """A room's sync-free attention of captured ragged steps (q, pools, cu_seqlens_q, positions, tables, lens)."""
    TorchPagedBackend.captured_varlen = staticmethod(kernel)
