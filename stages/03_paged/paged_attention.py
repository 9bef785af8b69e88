"""The paged K/V pool and the attention backend that reads it through block tables.

The pool holds, for every layer, `num_blocks` blocks of `block_size` token slots. A token's
K/V goes to *slot* `block_id * block_size + offset`; the `slot_mapping` tells the backend the
slot of every new token in the flat batch, and a sequence's `block_table` lists its blocks in
order. This PyTorch gather is the reference that stage 06's Triton kernel is checked against.
A pool may store its K/V quantized (`kv_dtype` int8 or fp8: codes and scales, quantized_kv.py);
attention then reads the codes of the blocks it visits and dequantizes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata, causal_attention
from course.s01_decode_loop.config import ModelConfig

from .quantized_kv import SCALE_DTYPE, QuantizedPool, is_quantized


class PagedKVCache:
    """K and V pools: [layers, num_blocks, block_size, n_kv_heads, head_dim] each, in `dtype`, or in
    `kv_dtype` (int8, fp8) with `k_scale`/`v_scale` [layers, num_blocks, block_size, n_kv_heads].
    Layers: those that keep K/V (`num_kv_layers`; a hybrid model numbers its attention layers apart),
    or `num_layers` of them (one layer group's pool: layer_groups.py)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu",
                 kv_dtype: torch.dtype | None = None, num_layers: int | None = None):
        shape = (num_layers or config.num_kv_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.dtype, self.kv_dtype = dtype, kv_dtype or dtype  # what attention computes in; what the pool stores
        self.k = torch.zeros(shape, dtype=self.kv_dtype, device=device)
        self.v = torch.zeros(shape, dtype=self.kv_dtype, device=device)
        self.k_scale = self.v_scale = None
        if is_quantized(self.kv_dtype):
            self.k_scale = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)
            self.v_scale = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)
        self.block_size = block_size
        self.windows = config.layer_windows  # each layer's sliding window (None: full), () if none slides

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor a block lives in, [layers, num_blocks, block_size, ...]: K and V, then a
        quantized pool's scales. Whatever moves or copies a block moves all of them."""
        return (self.k, self.v) + ((self.k_scale, self.v_scale) if self.quantized else ())

    def pools(self, layer: int):
        """The layer's K and V pools, [num_blocks, block_size, Hkv, D]: tensors, or QuantizedPools
        that dequantize what they are indexed with."""
        if self.kv_dtype == self.dtype:
            return self.k[layer], self.v[layer]
        scales = (None, None) if not self.quantized else (self.k_scale[layer], self.v_scale[layer])
        return (QuantizedPool(self.k[layer], scales[0], self.dtype),
                QuantizedPool(self.v[layer], scales[1], self.dtype))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, Hkv, D] into the layer's pool at slots [T]."""
        for pool, x in zip(self.pools(layer), (k, v)):
            if isinstance(pool, QuantizedPool):
                pool.store(slots, x)
            else:
                pool.view(-1, *x.shape[1:])[slots] = x.to(pool.dtype)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks, every layer (for BlockManager.fork)."""
        for src, dst in pairs:
            for t in self.tensors():
                t[:, dst] = t[:, src]


@dataclass
class PagedAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor = None  # [T] int64: pool slot of each new token
    block_tables: torch.Tensor = None  # [B, max_blocks] int64: each sequence's blocks, in order
    by_layer: list | None = None       # with layer groups: each layer's metadata (layer_groups.py)

    def for_layer(self, layer: int) -> "PagedAttentionMetadata":
        return self.by_layer[layer] if self.by_layer else self

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
    takes_sinks = True

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.windows = cache.windows

    def forward(self, layer, q, k, v, meta: PagedAttentionMetadata, sinks=None):
        bs = self.cache.block_size
        # 1. write this step's K/V into their slots (a view of the pool as one long row of slots)
        self.cache.write(layer, meta.slot_mapping, k, v)
        k_pool, v_pool = self.cache.pools(layer)  # [num_blocks, bs, kv, d]
        # 2. each sequence gathers its blocks back into order and attends over them
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for b, total in enumerate(meta.seq_lens.tolist()):
            blocks = meta.block_tables[b, : -(-total // bs)]
            k_seq = k_pool[blocks].flatten(0, 1)[:total]  # [total, kv, d]
            v_seq = v_pool[blocks].flatten(0, 1)[:total]
            start, end = bounds[b], bounds[b + 1]
            out[start:end] = causal_attention(q[start:end], k_seq, v_seq, q_start=total - (end - start),
                                              window=self.window(layer), sinks=sinks)
        return out
