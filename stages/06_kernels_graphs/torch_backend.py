"""The PyTorch backend: stage 03's math on the paged pool, the reference every kernel is held to.

* Captured steps (graph_runner.py builds their metadata, with no host lengths): every
  sequence's table is gathered at once and masked past its length (and, for a mixed step,
  past each query's position). More bytes than needed, but fixed shapes and no host sync,
  so a CUDA graph can capture it (`decode_attention_gather`, `varlen_attention_gather`).
* Eager steps: decodes the same way; prefill chunks through stage 03's `PagedAttention`,
  sequence by sequence (a gather of every row's keys would be T x L). A subclass may plan an
  eager step once from its host lengths (`plan_step`), as the CPU room's backends do.
"""
from __future__ import annotations

import torch

from course.s03_paged.paged_attention import PagedAttention, PagedKVCache

from .backend_base import KernelBackend, KernelMetadata


class TorchPagedBackend(KernelBackend):
    name = "torch"

    def __init__(self, cache: PagedKVCache):
        super().__init__(cache)
        self.reference = PagedAttention(cache)

    def build_metadata(self, *, host_lens=None, **kw) -> KernelMetadata:
        meta = super().build_metadata(**kw)
        if host_lens and not meta.graphed:
            meta.plan = self.plan_step(meta, *host_lens)
        return meta

    def plan_step(self, meta: KernelMetadata, query_lens: list[int], lens: list[int]):
        """An eager step's plan, made once per step from the host's lengths (None: no plan)."""
        return None

    def write_kv(self, layer, k, v, meta: KernelMetadata):
        """The step's new K/V into the layer's pool at their slots; returns the pools."""
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, bs, Hkv, D]
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        return k_pool, v_pool

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        if not meta.is_decode and not meta.graphed:  # eager prefill chunks: stage 03's path
            return self.reference.forward(layer, q, k, v, meta)
        k_pool, v_pool = self.write_kv(layer, k, v, meta)
        if meta.is_decode:
            return decode_attention_gather(q, k_pool, v_pool, meta.block_tables, meta.seq_lens)
        return varlen_attention_gather(q, k_pool, v_pool, meta.cu_seqlens_q, meta.positions, meta.block_tables,
                                       meta.seq_lens)


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


def varlen_attention_gather(q, k_pool, v_pool, cu_seqlens_q, positions, block_tables, seq_lens):
    """decode_attention_gather for a ragged step: q [T, H, D], rows cu_seqlens_q[b]:[b+1] of
    sequence b at `positions`. Sync-free: each row finds its sequence with a searchsorted on the
    device and sees its sequence's keys up to its own position. Rows of no sequence (bucket
    padding) come out as zeros."""
    t, h, d = q.shape
    num_seqs, kv_heads = seq_lens.shape[0], k_pool.shape[2]
    rows = torch.arange(t, device=q.device)
    seq = torch.searchsorted(cu_seqlens_q[1:], rows, right=True)  # [T]: the sequence of each row
    owned = seq < num_seqs
    seq = seq.clamp(max=num_seqs - 1)
    keys = k_pool[block_tables[seq]].flatten(1, 2)  # [T, W*bs, Hkv, D]
    values = v_pool[block_tables[seq]].flatten(1, 2)
    qg = q.float().view(t, kv_heads, h // kv_heads, d)
    scores = torch.einsum("tngd,tlnd->tngl", qg, keys.float()) * d ** -0.5
    span = torch.arange(keys.shape[1], device=q.device)[None, :]
    visible = (span <= positions[:, None]) & (span < seq_lens[seq][:, None]) & owned[:, None]  # [T, L]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.where(visible[:, None, None, :], scores.softmax(-1), 0.)  # an all-masked row: 0, not NaN
    out = torch.einsum("tngl,tlnd->tngd", weights.nan_to_num(0.), values.float())
    return out.reshape(t, h, d).to(q.dtype)
