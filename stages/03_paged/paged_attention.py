"""The paged K/V pool and the attention backend that reads it through block tables.

The pool holds, for every layer, `num_blocks` blocks of `block_size` token slots. A token's
K/V goes to *slot* `block_id * block_size + offset`; the `slot_mapping` tells the backend the
slot of every new token in the flat batch, and a sequence's `block_table` lists its blocks in
order. This PyTorch gather is the reference that stage 06's Triton kernel is checked against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata, causal_attention
from course.s01_decode_loop.config import ModelConfig


class PagedKVCache:
    """K and V pools: [layers, num_blocks, block_size, n_kv_heads, head_dim] each."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        shape = (config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks, every layer (for BlockManager.fork)."""
        for src, dst in pairs:
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]


@dataclass
class PagedAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor = None  # [T] int64: pool slot of each new token
    block_tables: torch.Tensor = None  # [B, max_blocks] int64: each sequence's blocks, in order

    @classmethod
    def build(cls, seqs: list[tuple[int, int, list[int]]], block_size: int, device="cpu") -> "PagedAttentionMetadata":
        """seqs: (num_cached, num_new, block_table) per sequence: the new tokens sit at
        positions num_cached .. num_cached + num_new - 1."""
        positions, slots, cu = [], [], [0]
        for cached, new, table in seqs:
            for p in range(cached, cached + new):
                positions.append(p)
                slots.append(table[p // block_size] * block_size + p % block_size)
            cu.append(cu[-1] + new)
        width = max(len(t) for _, _, t in seqs)
        tables = [t + [0] * (width - len(t)) for _, _, t in seqs]  # padding is never read
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return cls(positions=as_long(positions), cu_seqlens_q=as_long(cu),
                   seq_lens=as_long([c + n for c, n, _ in seqs]), slot_mapping=as_long(slots),
                   block_tables=as_long(tables))


class PagedAttention(AttentionBackend):
    def __init__(self, cache: PagedKVCache):
        self.cache = cache

    def forward(self, layer, q, k, v, meta: PagedAttentionMetadata):
        bs = self.cache.block_size
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, bs, kv, d]
        # 1. write this step's K/V into their slots (a view of the pool as one long row of slots)
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        # 2. each sequence gathers its blocks back into order and attends over them
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for b, total in enumerate(meta.seq_lens.tolist()):
            blocks = meta.block_tables[b, : -(-total // bs)]
            k_seq = k_pool[blocks].flatten(0, 1)[:total]  # [total, kv, d]
            v_seq = v_pool[blocks].flatten(0, 1)[:total]
            start, end = bounds[b], bounds[b + 1]
            out[start:end] = causal_attention(q[start:end], k_seq, v_seq, q_start=total - (end - start))
        return out
