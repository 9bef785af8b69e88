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


def sequence_kv(case: PagedCase, b: int) -> list[torch.Tensor]:
    """Sequence b's keys and values gathered back into order, float32 [total, Hkv, D] each."""
    total, bs = case.seq_lens[b].item(), case.k_cache.shape[1]
    blocks = case.block_tables[b, : -(-total // bs)].long()
    return [pool[blocks].flatten(0, 1)[:total].float() for pool in (case.k_cache, case.v_cache)]


def reference_attention(case: PagedCase, scale: float | None = None, window: int | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Stage 03's way: gather each sequence's blocks back into order, then stage 01's causal
    attention (with a sliding layer's `window` and gpt-oss's `sinks` [H]), in float32.
    Returns [T, H, D] float32."""
    d = case.q.shape[-1]
    out = torch.empty(case.q.shape, dtype=torch.float32)
    for b, total in enumerate(case.seq_lens.tolist()):
        k, v = sequence_kv(case, b)
        start, end = case.cu_seqlens_q[b].item(), case.cu_seqlens_q[b + 1].item()
        q = case.q[start:end].float()
        if scale is not None:  # causal_attention scales by d**-0.5; fold any other scale into q
            q = q * (scale * d ** 0.5)
        out[start:end] = causal_attention(q, k, v, q_start=total - (end - start), window=window,
                                          sinks=None if sinks is None else sinks.float())
    return out


def kernel_rows(case: PagedCase) -> list[torch.Tensor]:
    """Each query row of the case as a CPU-kernel row (cpu/attention.py): (rows, seqs, lens), its
    sequence, and the tokens up to its own."""
    rows, seqs, lens = [], [], []
    for b, (total, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens)):
        start = case.cu_seqlens_q[b].item()
        rows += range(start, start + new)
        seqs += [b] * new
        lens += range(total - new + 1, total + 1)
    return [torch.tensor(x, dtype=torch.long) for x in (rows, seqs, lens)]


def poison_before_window(case: PagedCase, window: int | None, tile: int = 16) -> int:
    """NaN in every key and value more than `tile` keys before the first query's window (a kernel
    that walks from the window on whole tiles may load up to tile - 1 keys before it, never
    these); nothing without a window. Returns how many slots were poisoned."""
    bs, poisoned = case.k_cache.shape[1], 0
    for b, total in enumerate(case.seq_lens.tolist()):
        for pos in range(max(0, total - case.query_lens[b] - (window or total) + 1 - tile)):
            block, offset = case.block_tables[b, pos // bs].item(), pos % bs
            case.k_cache[block, offset] = float("nan")
            case.v_cache[block, offset] = float("nan")
            poisoned += 1
    return poisoned


def fresh_kv(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's own k, v [T, Hkv, D], read from their pool slots (before any poisoning)."""
    page = case.k_cache.shape[1]
    slots = [case.block_tables[b, p // page].item() * page + p % page
             for b, (total, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens))
             for p in range(total - new, total)]
    slots = torch.tensor(slots, dtype=torch.long)
    return case.k_cache.flatten(0, 1)[slots].clone(), case.v_cache.flatten(0, 1)[slots].clone()


def nan_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer that shows every element the kernel forgot to write."""
    return torch.full_like(x, float("nan"))


def strided_q_and_out(case: PagedCase) -> torch.Tensor:
    """Give the case a q strided along the head dim (stride 2); returns a NaN output strided too."""
    wide = torch.randn(case.q.shape[0], case.q.shape[1], 2 * case.q.shape[2])
    wide[..., ::2] = case.q
    case.q = wide[..., ::2]
    return nan_like(wide)[..., 1::2]


def assert_matches_reference(out: torch.Tensor, case: PagedCase, tol: float = 1e-5, scale=None) -> torch.Tensor:
    """A kernel's output for `case`: q's shape and dtype, every row written and nothing read
    from a poisoned slot (no NaN), and the oracle's values (compared on the CPU)."""
    assert out.dtype == case.q.dtype and out.shape == case.q.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float().cpu(), reference_attention(case.cpu(), scale), atol=tol, rtol=tol)
    return out


def run_decode(kernel, case: PagedCase, **kw) -> torch.Tensor:
    """A paged decode kernel (the lesson's or the gpu room's) on the case's batch, into a
    NaN-filled output unless `out` is given (`out=None`: the kernel allocates its own)."""
    kw.setdefault("out", nan_like(case.q))
    return kernel(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, **kw)


def run_varlen(kernel, case: PagedCase, **kw) -> torch.Tensor:
    """A varlen paged kernel (queries of several lengths) on the case, into a NaN-filled output
    unless `out` is given."""
    kw.setdefault("out", nan_like(case.q))
    return kernel(case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens, case.block_tables,
                  case.max_query_len, **kw)


def check_decode(kernel, case: PagedCase, tol: float = 1e-5, **kw) -> torch.Tensor:
    """`run_decode` (into a NaN-filled output), held to the oracle."""
    return assert_matches_reference(run_decode(kernel, case, **kw), case, tol, kw.get("scale"))


def one_layer_step(case: PagedCase, make_backend, host: bool = True, graphed: bool = False):
    """The case's pool as a one-layer cache behind `make_backend(cache)`, and the step's metadata.
    The step writes each new token's K/V back to its own slot (so the pool is unchanged and the
    oracle still applies); returns (backend, metadata, (k, v) of the new tokens). The pool is made
    finite (the engine's is: padded reads stay finite). `host`: the runner's host lengths, or none;
    `graphed`: the metadata of a captured step (no host lengths)."""
    from types import SimpleNamespace

    from course.s03_paged.paged_attention import PagedKVCache

    from ..step_inputs import step_inputs

    k_pool = torch.nan_to_num(case.k_cache, nan=7.0)
    v_pool = torch.nan_to_num(case.v_cache, nan=-7.0)
    num_blocks, block_size, kv_heads, head_dim = k_pool.shape
    shape = SimpleNamespace(num_kv_layers=1, num_key_value_heads=kv_heads, head_dim=head_dim, layer_windows=())
    cache = PagedKVCache(shape, num_blocks, block_size, dtype=k_pool.dtype, device=k_pool.device)
    cache.k[0], cache.v[0] = k_pool, v_pool
    tables = case.block_tables.long()
    seqs = [(total - new, new, table) for total, new, table in zip(case.seq_lens.tolist(), case.query_lens,
                                                                   tables.tolist())]
    inputs = step_inputs(seqs, cache.block_size, dummy_block=-1, width=tables.shape[1])
    slots = torch.tensor(inputs.slot_mapping)
    backend = make_backend(cache)
    meta = backend.build_metadata(positions=torch.tensor(inputs.positions), cu_seqlens_q=case.cu_seqlens_q.long(),
                                  seq_lens=case.seq_lens.long(), slot_mapping=slots, block_tables=tables,
                                  max_query_len=case.max_query_len, max_seq_len=max(inputs.seq_lens),
                                  host_lens=(inputs.query_lens, inputs.seq_lens) if host and not graphed else None,
                                  graphed=graphed)
    return backend, meta, (cache.k[0].flatten(0, 1)[slots], cache.v[0].flatten(0, 1)[slots])


def record_captures(graphs) -> list:
    """Every step function `graphs` captures from now on, in order (its first default: its
    bucket), captured by the same backend as before."""
    order, backend = [], graphs.capture_backend
    graphs.capture_backend = type("Recorder", (), {"capture": lambda self, step: order.append(step) or
                                                   backend.capture(step)})()
    return order


def stored_case(case: PagedCase, dtype: torch.dtype):
    """The case's pools stored as stage 03 stores a bfloat16, int8 or fp8 KV cache: (k pool, v pool,
    the float case they load back to, the oracle's input). The NaN slots stay poisoned: NaN values
    (bfloat16) or codes (fp8); int8, which has no NaN, gets random codes at its rows' median scale
    there, keys and values like the real ones: a stray read moves the output by about 1 / length,
    far past any test's tolerance (an extreme key could instead hide behind a negative score)."""
    from course.s03_paged.quantized_kv import QuantizedPool, load_rows, store_rows

    pools, g = [], torch.Generator().manual_seed(0)
    for pool in (case.k_cache, case.v_cache):
        codes, scales = store_rows(pool, dtype)
        poisoned = pool.isnan().any(dim=-1)
        if dtype == torch.int8 and poisoned.any():
            codes[poisoned] = torch.randint(-127, 128, codes[poisoned].shape, generator=g, dtype=torch.int8)
            scales[poisoned] = scales[~poisoned].median()
        pools.append(QuantizedPool(codes, scales, torch.float32))
    k, v = (load_rows(p.codes, p.scales) for p in pools)
    return pools[0], pools[1], replace(case, k_cache=k, v_cache=v)
