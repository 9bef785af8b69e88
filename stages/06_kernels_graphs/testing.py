"""Random paged batches for the kernel tests, and the PyTorch oracle they are checked against.

A kernel that reads one element too many or writes one too few can still pass on a clean
pool, so every case here is built to catch it: the pool is filled with NaN wherever no
sequence keeps a token (a stray read turns the output NaN), block tables are shuffled and
padded with a poisoned block id, and outputs start as NaN (an unwritten row stays NaN).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from course.s01_decode_loop.attention import causal_attention


@dataclass
class PagedCase:
    """One layer's pool and a ragged batch over it. Sequence b has seq_lens[b] tokens in the
    pool; its new (query) tokens are the last query_lens[b] of them."""

    q: torch.Tensor             # [T, H, D]: T = sum(query_lens)
    k_cache: torch.Tensor       # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, W] int32; unused entries point at a NaN-filled block
    seq_lens: torch.Tensor      # [B] int32
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    query_lens: list[int]

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    def cpu(self) -> "PagedCase":
        """The same case on the CPU (reference_attention's side of a GPU check)."""
        tensors = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "cu_seqlens_q")
        return replace(self, **{name: getattr(self, name).cpu() for name in tensors})


def make_paged_case(seq_lens: list[int], query_lens: list[int], *, num_heads: int, num_kv_heads: int,
                    head_dim: int, block_size: int, dtype=torch.float32, seed: int = 0,
                    extra_blocks: int = 3, device="cpu") -> PagedCase:
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    ids = torch.randperm(num_blocks, generator=g).tolist()  # shuffled: tables are not contiguous
    poison_block = ids.pop()  # stays NaN: table padding points here
    width = max(blocks_per_seq) + 1  # one column of padding even for the longest sequence
    tables = []
    for n, nb in zip(seq_lens, blocks_per_seq):
        mine = [ids.pop() for _ in range(nb)]
        for pos in range(n):  # only slots a sequence owns get values; a block's tail stays NaN
            blk, off = mine[pos // block_size], pos % block_size
            k_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=g)
            v_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=g)
        tables.append(mine + [poison_block] * (width - nb))
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g)
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    as_int = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return PagedCase(q=q.to(device, dtype), k_cache=k_cache.to(device, dtype), v_cache=v_cache.to(device, dtype),
                     block_tables=as_int(tables), seq_lens=as_int(seq_lens), cu_seqlens_q=as_int(cu),
                     query_lens=list(query_lens))


def reference_attention(case: PagedCase, scale: float | None = None) -> torch.Tensor:
    """Stage 03's way: gather each sequence's blocks back into order, then stage 01's causal
    attention, in float32. Returns [T, H, D] float32."""
    bs = case.k_cache.shape[1]
    d = case.q.shape[-1]
    out = torch.empty(case.q.shape, dtype=torch.float32)
    for b, total in enumerate(case.seq_lens.tolist()):
        blocks = case.block_tables[b, : -(-total // bs)].long()
        k = case.k_cache[blocks].flatten(0, 1)[:total].float()
        v = case.v_cache[blocks].flatten(0, 1)[:total].float()
        start, end = case.cu_seqlens_q[b].item(), case.cu_seqlens_q[b + 1].item()
        q = case.q[start:end].float()
        if scale is not None:  # causal_attention scales by d**-0.5; fold any other scale into q
            q = q * (scale * d ** 0.5)
        out[start:end] = causal_attention(q, k, v, q_start=total - (end - start))
    return out


def nan_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer that shows every element the kernel forgot to write."""
    return torch.full_like(x, float("nan"))


def one_layer_step(case: PagedCase, make_backend, host: bool = True):
    """The case's pool as a one-layer cache behind `make_backend(cache)`, and the step's metadata.
    The step writes each new token's K/V back to its own slot (so the pool is unchanged and the
    oracle still applies); returns (backend, metadata, (k, v) of the new tokens). The pool is made
    finite (the engine's is: padded reads stay finite); `host`: the runner's host lengths, or none."""
    from types import SimpleNamespace

    k_pool = torch.nan_to_num(case.k_cache, nan=7.0)
    v_pool = torch.nan_to_num(case.v_cache, nan=-7.0)
    cache = SimpleNamespace(k=k_pool[None].clone(), v=v_pool[None].clone(), block_size=case.k_cache.shape[1])
    bs, slots, positions = cache.block_size, [], []
    tables = case.block_tables.long()
    for b, (total, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens)):
        for p in range(total - new, total):
            positions.append(p)
            slots.append(tables[b, p // bs].item() * bs + p % bs)
    backend = make_backend(cache)
    host_lens = (case.query_lens, case.seq_lens.tolist()) if host else None
    meta = backend.build_metadata(positions=torch.tensor(positions), cu_seqlens_q=case.cu_seqlens_q.long(),
                                  seq_lens=case.seq_lens.long(), slot_mapping=torch.tensor(slots),
                                  block_tables=tables, max_query_len=case.max_query_len,
                                  max_seq_len=max(case.seq_lens.tolist()), host_lens=host_lens)
    flat = cache.k[0].flatten(0, 1)[torch.tensor(slots)], cache.v[0].flatten(0, 1)[torch.tensor(slots)]
    return backend, meta, flat


def decode_pool(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype,
                device, shuffle: bool = False):
    """A decode step's inputs for timing the kernel: `batch` sequences of `context` tokens in a
    random pool (their pages in order, or shuffled), one query each. Returns (q, k_pool,
    v_pool, block_tables, seq_lens, out, nbytes), nbytes being what the kernel must move."""
    pages = -(-context // block_size)
    k = torch.randn(batch * pages + 1, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    order = torch.randperm if shuffle else torch.arange
    tables = order(batch * pages, device=device, dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    nbytes = 2 * batch * context * kv_heads * head_dim * dtype.itemsize + 2 * q.nbytes + tables.nbytes
    return q, k, v, tables, lens, torch.empty_like(q), nbytes
