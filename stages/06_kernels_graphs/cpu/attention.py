"""Paged attention on the CPU in ~150 lines of C (attention.c), called through ctypes.

Why C, in a Python course: on the CPU Triton does not compile (CI runs its kernels through
the interpreter), and PyTorch cannot read a paged pool in place: every torch formulation
first gathers each sequence's blocks into a padded copy, then attends to the copy. On our
2-core CPU that copy and the padded SDPA after it cost 2.4 ms per layer for 32 decodes of
100-300 tokens, 30 layers a step; reading the blocks where they lie costs 0.48 ms
(bench_cpu_kernels.py). vLLM for CPU ships C++ attention kernels for the same reason. The kernel is the Triton decode kernel's
algorithm (online softmax over the block table), one loop nest per (row, KV head), with
AVX-512 code for a block's scores and value sums where the head size allows. A pool stored in
bfloat16, int8 or fp8 (stage 03's quantized_kv.py) is read as it lies, codes and scales, and
turned into floats a block at a time on the kernel's stack.

Compiled once per machine (native.py); without a C compiler, `kernel_unavailable()` says why
and the engine keeps the PyTorch backend.

    python -m course.s06_kernels_graphs.cpu.bench_cpu_kernels   # the ratios on this machine
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import native

SOURCE = Path(__file__).with_name("attention.c")
FLAGS = native.BASE_FLAGS + ["-ffast-math"]  # vectorized exp: see the .c
LIMITS = {"query heads per KV head": 16, "head_dim": 256, "block_size": 128}  # the C file's stack arrays


@native.cached_loader
def _library():
    fn = native.load(SOURCE, FLAGS).paged_attention_rows_f32
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [ptr, i64, ptr, ptr, ptr, ctypes.c_int, ptr, ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, ptr, ptr,
                   i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = i64
    return fn


def kernel_unavailable() -> str | None:
    """None when the kernel compiles and loads here, else the reason."""
    return native.unavailable(_library)


# what a pool stores -> attention.c's KV_F32, KV_BF16, KV_INT8, KV_FP8
KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2, torch.float8_e4m3fn: 3}


def pool_parts(pool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's pool as (values or codes, scales or None): a tensor, or stage 03's QuantizedPool."""
    return (pool, None) if isinstance(pool, torch.Tensor) else (pool.codes, pool.scales)


def check_shapes(k_pool, query_heads: int | None = None) -> None:
    """Raise ValueError for what the kernel does not take."""
    codes, _ = pool_parts(k_pool)
    _, block_size, kv_heads, head_dim = codes.shape
    if codes.dtype not in KV_KINDS or codes.device.type != "cpu":
        raise ValueError(f"the CPU kernel reads pools of {', '.join(str(t).removeprefix('torch.') for t in KV_KINDS)} "
                         f"on the CPU, not {codes.dtype} on {codes.device}")
    sizes = {"query heads per KV head": (query_heads or kv_heads) // kv_heads, "head_dim": head_dim,
             "block_size": block_size}
    for what, limit in LIMITS.items():
        if sizes[what] > limit:
            raise ValueError(f"the CPU kernel takes at most {limit} for {what}, got {sizes[what]}")


def paged_attention_rows(q, k_pool, v_pool, block_tables, rows, seqs, lens, out=None, tree_first=None,
                         tree_bits=None, window: int | None = None, sinks=None) -> torch.Tensor:
    """out[rows[i]] = attention of q[rows[i]] to the first lens[i] tokens of sequence seqs[i]
    (its blocks: block_tables[seqs[i]]). q [T, H, D] float32; pools [num_blocks, bs, Hkv, D];
    rows/seqs/lens int64 [n]. Rows of `out` not named in `rows` are left as they are.
    A speculative tree's rows: of the keys from tree_first[i] on, only those whose bit is set in
    tree_bits[i] (int64 [n], bit j: key tree_first[i] + j); tree_first[i] = lens[i] elsewhere.
    A sliding layer's `window`: only the keys less than `window` positions behind the row's own
    (a plain row is at lens[i] - 1, a tree row at tree_first[i] + its depth, with the bits of
    ancestors `window` or more levels up already cleared: backend.tree_bits(mask, window)).
    `sinks` [H]: one logit per query head joining its softmax with no value (gpt-oss's attention
    sinks, stage 01's causal_attention), any float dtype; None: none."""
    if window is not None and window < 1:
        raise ValueError(f"a sliding window covers at least the row itself, got {window}")
    if sinks is not None:  # the C reads one float32 per query head
        if sinks.shape != (q.shape[1],):
            raise ValueError(f"sinks are one logit per query head: [{q.shape[1]}], got {list(sinks.shape)}")
        # -ffast-math code assumes no infinities: -inf (no sink) becomes the lowest float, whose term is still 0
        largest = torch.finfo(torch.float32).max
        sinks = sinks.detach().to(device="cpu", dtype=torch.float32).clamp(-largest, largest).contiguous()
    (k_pool, k_scale), (v_pool, v_scale) = pool_parts(k_pool), pool_parts(v_pool)
    for t in (rows, seqs, lens, block_tables) + ((tree_first, tree_bits) if tree_first is not None else ()):
        if t.dtype != torch.int64:
            raise ValueError(f"rows, seqs, lens, tree rows and block tables are int64, got {t.dtype}")
    if q.dtype != torch.float32 or not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("the CPU kernel takes float32 queries and contiguous pools")
    if q.shape[1] % k_pool.shape[2] or q.shape[1] // k_pool.shape[2] > LIMITS["query heads per KV head"]:
        raise ValueError(f"{q.shape[1]} query heads do not group onto {k_pool.shape[2]} KV heads "
                         f"(at most {LIMITS['query heads per KV head']} each)")
    rows, seqs, lens = rows.contiguous(), seqs.contiguous(), lens.contiguous()
    tree = (tree_first.contiguous(), tree_bits.contiguous()) if tree_first is not None else None
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    tables = block_tables.contiguous()
    if k_pool.dtype not in KV_KINDS or v_pool.dtype != k_pool.dtype or (k_scale is None) != (k_pool.element_size() > 1):
        raise ValueError(f"pools of {k_pool.dtype} and {v_pool.dtype}, with{'out' if k_scale is None else ''} "
                         "scales: the kernel reads float32 or bfloat16 values, or int8 or fp8 codes with their scales")
    address = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
    bad = _library()(q.data_ptr(), q.stride(0), out.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
                     KV_KINDS[k_pool.dtype], address(k_scale), address(v_scale), k_pool.shape[0],
                     rows.data_ptr(), seqs.data_ptr(), lens.data_ptr(), rows.numel(),
                     *((tree[0].data_ptr(), tree[1].data_ptr()) if tree else (None, None)), window or 0,
                     address(sinks), tables.data_ptr(), tables.shape[1], q.shape[1], k_pool.shape[2], q.shape[2],
                     k_pool.shape[1], q.shape[2] ** -0.5, torch.get_num_threads())
    if bad:
        raise RuntimeError(f"{bad} rows had a block table that does not cover their length, names a "
                           "block outside the pool, or a tree block wider than 64 or without its root "
                           "(in a sliding layer: without a key the row may see); an engine bug, nothing "
                           "was read out of bounds")
    return out
