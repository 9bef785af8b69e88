"""Attention backends behind stage 01's seam, chosen by name from the engine's config.

Both backends read stage 03's paged pool through block tables and build their own metadata
(`build_metadata`), since what a backend needs to know about a step differs: the Triton
decode kernel wants to know how many splits to run, the varlen kernel wants the longest query
for its grid. Two kinds of step exist:

* decode-only (every sequence brings one token): the common case, and the one CUDA graphs
  capture, so both backends do it without a single host sync;
* anything else (prefill chunks, mixed batches): run eagerly, where host syncs are allowed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s01_decode_loop.attention import AttentionBackend
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache



@dataclass
class KernelMetadata(PagedAttentionMetadata):
    max_query_len: int = 1   # host int: the longest new-token run (the prefill kernel's grid)
    is_decode: bool = False  # every sequence brings exactly one token
    num_splits: int = 1      # split-K partitions of the decode kernel (1 = single pass)


class KernelBackend(AttentionBackend):
    name = "?"

    def __init__(self, cache: PagedKVCache):
        self.cache = cache

    def build_metadata(self, *, positions, cu_seqlens_q, seq_lens, slot_mapping, block_tables,
                       max_query_len: int, max_seq_len: int) -> KernelMetadata:
        """Tensors are views of the runner's persistent buffers; the two ints are host-side
        facts of the step (never read back from the device)."""
        return KernelMetadata(positions=positions, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
                              slot_mapping=slot_mapping, block_tables=block_tables,
                              max_query_len=max_query_len, is_decode=max_query_len == 1)


class TorchPagedBackend(KernelBackend):
    """PyTorch only. Prefill and mixed steps use stage 03's gather (the reference); decode
    gathers every sequence's whole table at once and masks past its length: more bytes read
    than needed, but fixed shapes and no host sync, so a CUDA graph can capture it."""

    name = "torch"

    def __init__(self, cache: PagedKVCache):
        super().__init__(cache)
        self.reference = PagedAttention(cache)

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        if not meta.is_decode:
            return self.reference.forward(layer, q, k, v, meta)
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, bs, Hkv, D]
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        return decode_attention_gather(q, k_pool, v_pool, meta.block_tables, meta.seq_lens)


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens):
    """q: [B, H, D], one query per sequence at position seq_len-1. Sync-free: every shape comes
    from the block table's width, the lengths only enter through a mask. Table padding must
    hold valid block ids (the runner pads with its dummy block); the pool holds finite values."""
    b, h, d = q.shape
    kv_heads = k_pool.shape[2]
    keys = k_pool[block_tables].flatten(1, 2)  # [B, W*bs, Hkv, D]
    values = v_pool[block_tables].flatten(1, 2)
    qg = q.float().view(b, kv_heads, h // kv_heads, d)  # GQA: query heads grouped by their KV head
    scores = torch.einsum("bngd,blnd->bngl", qg, keys.float()) * d ** -0.5
    past_end = torch.arange(keys.shape[1], device=q.device)[None, :] >= seq_lens[:, None]  # [B, L]
    scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
    out = torch.einsum("bngl,blnd->bngd", scores.softmax(-1), values.float())
    return out.reshape(b, h, d).to(q.dtype)


class TritonPagedBackend(KernelBackend):
    """Stage 06's kernels: the KV scatter, then one attention launch per layer: the decode
    kernel (split-K for long contexts) when every sequence decodes, else the varlen kernel,
    which takes prefill chunks and decodes side by side."""

    name = "triton"

    def __init__(self, cache: PagedKVCache, num_splits: int | None = None):
        super().__init__(cache)
        self.num_splits = num_splits  # None: chosen per step from the batch shape
        self.num_sms = (torch.cuda.get_device_properties(cache.k.device).multi_processor_count
                        if cache.k.is_cuda else 1)  # the interpreter gains nothing from splits

    def build_metadata(self, *, max_seq_len: int, **kw) -> KernelMetadata:
        from .decode_attention import choose_num_splits

        meta = super().build_metadata(max_seq_len=max_seq_len, **kw)
        max_blocks = -(-max_seq_len // self.cache.block_size)
        meta.num_splits = self.num_splits or choose_num_splits(meta.num_seqs, self.cache.k.shape[3], max_blocks,
                                                                self.num_sms)
        return meta

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        from .decode_attention import paged_decode_attention
        from .kv_write import write_kv
        from .prefill_attention import varlen_paged_attention

        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]
        write_kv(k, v, k_pool, v_pool, meta.slot_mapping)
        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          num_splits=meta.num_splits)
        return varlen_paged_attention(q, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens,
                                      meta.block_tables, meta.max_query_len)


BACKENDS = {"torch": TorchPagedBackend, "triton": TritonPagedBackend}


def make_backend(name: str, cache: PagedKVCache, **options) -> KernelBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](cache, **options)
