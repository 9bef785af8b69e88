"""Paged decode attention on tensor cores, with each request's split-KV worked out on the GPU.

The lesson's kernel (../decode_attention.py) is right but slow on a GPU: each 16-key tile
costs a page-id load, K and V upcast to fp32, and a broadcast product summed in registers.
No tensor cores, about 4 KB per dependent memory round trip, and no tl.dot whose loads
Triton's pipeliner could multi-buffer. Decode reads every cached byte once and computes
little with it, so what it needs is many bytes in flight. This kernel changes four things.

1. Both products on tensor cores. A GQA group has only G = H / Hkv query heads (1 to 8), too
   few for an MMA. SGLang's grouped decode kernel and vLLM's unified attention pad the group
   to 16 query rows so that q.k and p.v become tl.dot calls; padding rows cost compute, which
   decode has to spare. Hopper's warpgroup MMA (wgmma) needs 64 rows per warpgroup, and with
   16 query rows Triton falls back to the older mma.sync. So the products are transposed:
       s^T [keys, 16] = K [keys, D] @ q^T [D, 16]
       o^T [D, 16]    = V^T [D, keys] @ p^T [keys, 16]
   This puts 64 to 128 keys (or D) on the 64-row side and the padded heads on the narrow side,
   which wgmma allows (a multiple of 8 wide). Inputs stay in the pool's bf16/fp16 and the
   accumulators are fp32.

2. Wide tiles, pipelined. Each iteration reads 32 to 128 keys, not 16. Their page ids come
   from the block table as one vector load (any page size works, one id per key). K and V
   feed tl.dot directly, so with num_stages 2-3 Triton issues the next tiles' loads
   (cp.async) while the current one is computed.

3. exp2, with log2(e) folded into the scale: softmax(s) = 2^(s * scale * log2 e - m), the
   hardware's native exponential, with no extra multiply per score.

4. Split-KV per request (FlashDecoding). Few long sequences give too few programs to fill
   the GPU, so each sequence's keys are cut into splits, one program each, and merged by
   their log-sum-exp. The lesson's kernel cuts the block table's columns into equal ranges,
   and a table is 128 columns wide in a graph, so a short sequence's later splits hold no
   keys and still cost a program and a merge. Here the grid is fixed, (B, Hkv, max_splits)
   from shapes only, and each program works out ON THE DEVICE how many splits its own
   sequence needs: at least `min_keys_per_split` keys each, never more than max_splits,
   never an empty one (SGLang's Triton backend also keeps a per-request split count on the
   device). A sequence with one split is written straight to `out` and the merge kernel
   skips it; with max_splits == 1 the merge is not launched at all. No host reads a device
   value, so the call can be captured in a CUDA graph.

5. Sliding windows. In a sliding layer the query at seq_len - 1 sees only the sequence's
   last `window` keys, one contiguous run at its end. The kernel works on that run alone:
   the walk starts at the tile holding the window's first key and the splits divide the keys
   from there, so a long sequence in a sliding layer reads (and splits) its window, not its
   length. Only that first tile masks keys (those before the window). `window` is a runtime
   int (0: the whole sequence) that the launcher never specializes, so one compiled kernel
   serves full and sliding layers alike.

6. Attention sinks (gpt-oss). A head's sink is one more logit in its softmax's sum, with no
   value behind it. After its walk, a program folds it in as the online softmax folds a tile:
   with running max m and sum l, M = max(m, sink), acc and l rescaled by 2^(m - M), and
   l += 2^(sink - M) (the sink taken to log2 units, as the scores). Only split 0 adds it: the
   merge sums the splits' l, each weighed by its lse, so it is counted once, and a sequence
   with one split has it in its output at once. HAS_SINKS is a constexpr: the kernel compiled
   without sinks holds no sink code at all.

`query_start` (cu_seqlens_q) lets a mixed step run this kernel and the prefill kernel side
by side on the same q and out. Sequence b's query row is query_start[b], and it is attended
only if its query length is 1. Prefill chunks, verifications and padding sequences keep
their rows untouched, for the other kernel.

Tile sizes come from a small table per (compute capability, head dim, dtype),
`decode_tiles`, and not from autotuning, which syncs and cannot run inside a graph capture.
The interpreter gets small tiles, and fp32 (ieee) dots because its 16-bit arithmetic is
not faithful. `compile_cases` lists the kernels at the stage's shapes for the sm_90
compile report.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)
SINK_LOG2E = tl.constexpr(LOG2E)  # the same, for a kernel (a global it reads must be a constexpr)
HEADS_PADDED = 16  # the group's query heads padded to the narrow side of the MMA


def _heads_tile(group: int) -> int:
    return max(HEADS_PADDED, triton.next_power_of_2(group))  # a group wider than 16: the next power of two


@triton.jit
def _window_keys(seq_len, window, BLOCK_N: tl.constexpr):
    """(first, start, count) for the decode query at seq_len - 1 of one sequence. first: the
    first key it sees, 0 or in a sliding layer (window > 0) seq_len - window. start: first
    rounded down to a whole tile, where the walk begins (tiles on multiples of BLOCK_N, which
    the compiler can see, take fewer registers than tiles at any key); the keys from start to
    first are masked. count: the keys from start to the end, which the splits share."""
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    start = (first // BLOCK_N) * BLOCK_N
    return first, start, seq_len - start


@triton.jit
def _request_splits(seq_len, MAX_SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(splits, keys per split) for `seq_len` keys of one sequence, on the device. Every split
    gets whole tiles, at least MIN_KEYS keys (fewer only if there are fewer), and none is empty."""
    want = tl.minimum(tl.maximum(tl.cdiv(seq_len, MIN_KEYS), 1), MAX_SPLITS)
    per_split = tl.cdiv(tl.cdiv(seq_len, want), BLOCK_N) * BLOCK_N
    per_split = tl.maximum(per_split, BLOCK_N)  # a sequence of length 0 still has one split
    return tl.maximum(tl.cdiv(seq_len, per_split), 1), per_split


@triton.jit(do_not_specialize=["window"])  # a runtime int: full and sliding layers share one kernel
def _grouped_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_lse_ptr, bt_ptr, seq_lens_ptr, query_start_ptr, sinks_ptr,
    qk_scale, window, stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MAX_SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr,
    HAS_QUERY_START: tl.constexpr, DOT_16BIT: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    if HAS_QUERY_START:  # a mixed step: only sequences whose query is one token are ours
        row = tl.load(query_start_ptr + b).to(tl.int64)
        if tl.load(query_start_ptr + b + 1).to(tl.int64) - row != 1:
            return
    else:
        row = b
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    first, walk_start, num_keys = _window_keys(seq_len, window, BLOCK_N)  # a sliding layer: its window only
    num_splits, per_split = _request_splits(num_keys, MAX_SPLITS, MIN_KEYS, BLOCK_N)
    if split >= num_splits:  # the grid has max_splits; this sequence needs fewer
        return

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h  # the query heads that share this KV head
    # q^T [D, 16]: the group's heads as columns, zero columns for the padding.
    q_t = tl.load(q_ptr + row * stride_qt + heads[None, :] * stride_qh + offs_d[:, None],
                  mask=d_ok[:, None] & h_ok[None, :], other=0.)
    if DOT_16BIT:
        q_t = q_t.to(k_ptr.dtype.element_ty)
    else:
        q_t = q_t.to(tl.float32)

    lo = walk_start + split * per_split  # tiles before the window's are never read
    hi = tl.minimum(lo + per_split, seq_len)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max per head, in log2 units
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_D, BLOCK_H], tl.float32)  # o^T, unnormalised
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi  # past the length: table padding, a page's NaN tail, never read
        page = tl.load(bt_ptr + b * stride_bt + offs_n // PAGE, mask=n_ok, other=0)  # one id per key
        slot = page.to(tl.int64) * stride_kb + (offs_n % PAGE) * stride_ks + kvh * stride_kh  # int64: big pools
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.)
        v = tl.load(v_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.)
        if DOT_16BIT:
            s = tl.dot(k, q_t)  # [N, 16] on tensor cores: keys on the MMA's 64-row side
        else:
            s = tl.dot(k.to(tl.float32), q_t, input_precision="ieee")
        s = tl.where(n_ok[:, None], s * qk_scale, float("-inf"))
        if start < first:  # the window's first tile (never without a window): hide the keys before it
            s = tl.where(offs_n[:, None] >= first, s, float("-inf"))
        # Every tile holds at least one visible key of the split (the window's first tile, the
        # window's first key), so m_new is finite: no NaN guard.
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.math.exp2(s - m_new[None, :])
        alpha = tl.math.exp2(m_i - m_new)  # rescale what earlier tiles accumulated
        l_i = l_i * alpha + tl.sum(p, axis=0)
        if DOT_16BIT:
            acc = tl.dot(tl.trans(v), p.to(v_ptr.dtype.element_ty), acc * alpha[None, :])
        else:
            acc = tl.dot(tl.trans(v.to(tl.float32)), p, acc * alpha[None, :], input_precision="ieee")
        m_i = m_new

    if HAS_SINKS:  # each head's sink: one more term in its sum, with no value
        if split == 0:  # counted once: the merge adds the splits' sums, each weighed by its lse
            sink = tl.load(sinks_ptr + heads, mask=h_ok, other=0.) * SINK_LOG2E  # in log2 units, as the scores
            m_new = tl.maximum(m_i, sink)  # finite, even for a sequence of length 0
            alpha = tl.math.exp2(m_i - m_new)
            acc, l_i, m_i = acc * alpha[None, :], l_i * alpha + tl.math.exp2(sink - m_new), m_new
    acc = acc / tl.where(l_i > 0., l_i, 1.)[None, :]  # length 0: zeros, never 0 / 0
    out_mask = d_ok[:, None] & h_ok[None, :]
    if num_splits == 1:  # the whole sequence in one program: straight to out, no merge
        tl.store(o_ptr + row * stride_ot + heads[None, :] * stride_oh + offs_d[:, None],
                 acc.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:  # fp32 scratch [B, H, MAX_SPLITS, D] and [B, H, MAX_SPLITS]; lse in log2 units
        lse = m_i + tl.math.log2(l_i)
        part = (b * (tl.num_programs(1) * GROUP) + heads) * MAX_SPLITS + split
        tl.store(part_o_ptr + part[None, :] * HEAD_DIM + offs_d[:, None], acc, mask=out_mask)
        tl.store(part_lse_ptr + part, lse, mask=h_ok)


@triton.jit(do_not_specialize=["window"])
def _merge_splits_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, seq_lens_ptr, query_start_ptr, window, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    MIN_KEYS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_QUERY_START: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    if HAS_QUERY_START:
        row = tl.load(query_start_ptr + b).to(tl.int64)
        if tl.load(query_start_ptr + b + 1).to(tl.int64) - row != 1:
            return
    else:
        row = b
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    _, _, num_keys = _window_keys(seq_len, window, BLOCK_N)  # the attention kernel's splits, worked out again
    num_splits, _ = _request_splits(num_keys, MAX_SPLITS, MIN_KEYS, BLOCK_N)
    if num_splits == 1:  # already written to out by its only split
        return
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits  # scratch past this sequence's splits is stale: never read
    d_ok = offs_d < HEAD_DIM
    part = (b * tl.num_programs(1) + h) * MAX_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + part, mask=s_ok, other=float("-inf"))
    o = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.)
    w = tl.math.exp2(lse - tl.max(lse, axis=0))  # every split holds keys: lse finite, max finite
    o = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(o_ptr + row * stride_ot + h * stride_oh + offs_d, o.to(o_ptr.dtype.element_ty), mask=d_ok)


@dataclass(frozen=True)
class DecodeTiles:
    """One launch's tile sizes. block_n: keys per tile (a power of two >= 16, tl.dot's minimum);
    min_keys_per_split: the fewest keys worth a split of their own (a multiple of block_n)."""

    block_n: int
    num_warps: int
    num_stages: int
    min_keys_per_split: int


def decode_tiles(capability: tuple[int, int] | None, head_dim: int, dtype: torch.dtype) -> DecodeTiles:
    """Tile sizes for a card (compute capability (major, minor)); None is the interpreter.

    Each pipeline stage holds a K and a V tile, block_n x D x 2 bytes each: 32 KB at D = 128
    with 64 keys, so 3 stages use 96 KB of the H100's 228 KB of shared memory per SM. At D = 64
    the tile doubles to 128 keys for the same bytes per round trip. 16-bit pools only: an fp32
    pool runs exact fp32 dots, half the keys per tile, two stages. min_keys_per_split keeps a
    split to several tiles, so the merge's extra traffic stays small next to the keys it saves."""
    if capability is None:  # the interpreter: small tiles so CPU tests split short sequences
        return DecodeTiles(block_n=16, num_warps=4, num_stages=1, min_keys_per_split=16)
    wide = 128 if head_dim <= 64 else 64
    if dtype == torch.float32:
        return DecodeTiles(block_n=wide // 2, num_warps=4, num_stages=2, min_keys_per_split=256)
    if capability >= (9, 0):  # Hopper: 228 KB of shared memory, wgmma
        return DecodeTiles(block_n=wide, num_warps=4, num_stages=3, min_keys_per_split=256)
    if capability in ((8, 0), (8, 7)):  # A100 / Orin: 164 KB
        return DecodeTiles(block_n=wide, num_warps=4, num_stages=3, min_keys_per_split=256)
    return DecodeTiles(block_n=wide // 2, num_warps=4, num_stages=2, min_keys_per_split=256)  # ~100 KB cards


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, *, query_start=None, scale=None,
                           max_splits=1, out=None, window: int | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's one query over its seq_lens[b] keys in the paged pool.

    q [T, H, D]; k/v_cache [num_blocks, page, Hkv, D] contiguous; block_tables [B, W] (int32 or
    int64); seq_lens [B]. Without query_start, T == B and row b is sequence b's query. With
    query_start (cu_seqlens_q [B+1]) sequence b's query is row query_start[b], attended only if
    its query length is 1; other rows are left as they are. Returns [T, H, D] in q's dtype,
    written into `out` if given. max_splits: the most splits any sequence may get (grid size);
    each sequence takes as many as its own length needs. window: a sliding layer's window, the
    query sees its sequence's last `window` keys only, and only they are read and split (None:
    every key). sinks: gpt-oss's [H] logits, one per query head (any float dtype), each one more
    term in its head's softmax with no value (None: none)."""
    T, H, D = q.shape
    B = seq_lens.shape[0]
    _, page, hkv, _ = k_cache.shape
    assert H % hkv == 0 and k_cache.is_contiguous() and v_cache.is_contiguous() and max_splits >= 1
    assert window is None or window >= 1, f"a window holds at least the query itself, not {window}"
    assert query_start is not None or T == B
    assert sinks is None or sinks.shape == (H,), f"one sink per query head ({H}), not {tuple(sinks.shape)}"
    if scale is None:
        scale = D ** -0.5
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    # The kernel reads a head, a table row and the length vectors as contiguous runs.
    q, block_tables, seq_lens = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, block_tables, seq_lens))
    if query_start is not None and query_start.stride(-1) != 1:
        query_start = query_start.contiguous()
    dest = out if out.stride(-1) == 1 else torch.empty(q.shape, dtype=out.dtype, device=out.device)
    if dest is not out and query_start is not None:
        dest.copy_(out)  # the rows this kernel skips must come back as they were
    group = H // hkv
    tiles = decode_tiles(_capability(q.device), D, k_cache.dtype)
    dot_16bit = q.is_cuda and k_cache.dtype in (torch.float16, torch.bfloat16)
    block_d = max(16, triton.next_power_of_2(D))
    if max_splits > 1:  # fp32 scratch, written only where a sequence has a split there
        part_o = torch.empty((B, H, max_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, H, max_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = dest  # unused: every sequence is a single split
    has_query_start = query_start is not None
    query_start = query_start if has_query_start else seq_lens  # a placeholder pointer
    has_sinks = sinks is not None
    sinks = sinks.float().contiguous() if has_sinks else seq_lens  # fp32 (a parameter's own if it is fp32)
    _grouped_decode_kernel[(B, hkv, max_splits)](
        q, k_cache, v_cache, dest, part_o, part_lse, block_tables, seq_lens, query_start, sinks,
        float(scale) * LOG2E, window or 0,
        q.stride(0), q.stride(1), dest.stride(0), dest.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=D, BLOCK_D=block_d, GROUP=group, BLOCK_H=_heads_tile(group),
        PAGE=page, BLOCK_N=tiles.block_n,
        MAX_SPLITS=max_splits, MIN_KEYS=tiles.min_keys_per_split, HAS_QUERY_START=has_query_start,
        DOT_16BIT=dot_16bit, HAS_SINKS=has_sinks, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if max_splits > 1:
        _merge_splits_kernel[(B, H)](
            part_o, part_lse, dest, seq_lens, query_start, window or 0, dest.stride(0), dest.stride(1),
            HEAD_DIM=D, BLOCK_D=block_d, MAX_SPLITS=max_splits, BLOCK_S=triton.next_power_of_2(max_splits),
            MIN_KEYS=tiles.min_keys_per_split, BLOCK_N=tiles.block_n, HAS_QUERY_START=has_query_start,
        )
    if dest is not out:
        out.copy_(dest)
    return out


# Programs per SM to aim for before splitting stops paying: measured for the lesson's kernel
# on an H200 (bench/tune_decode.py: B=32 at 2,048 tokens, 256 programs, 2 splits 1.5x faster).
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32


def choose_max_splits(batch: int, num_kv_heads: int, max_blocks: int, num_sms: int = 132) -> int:
    """The grid's split dimension: enough programs to keep every SM several deep.

    Without splits a decode launches batch * num_kv_heads programs, each walking its keys one
    dependent tile after another; an SM wants PROGRAMS_PER_SM of them to hide memory latency.
    Below that, allow up to the shortfall, never more splits than the table has blocks, nor
    MAX_SPLITS. This is only an upper bound: each sequence takes what its own length needs
    (min_keys_per_split keys a split), so short sequences in the same batch stay unsplit."""
    programs = max(1, batch * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    return max(1, min(target // programs, max_blocks, MAX_SPLITS))


def compile_cases(capability: tuple[int, int] = (9, 0), sinks: bool = False) -> list[dict]:
    """The decode kernels at the shapes the stage launches, for the sm_90 compile report:
    bf16 pools of 16-token pages and int64 tables (the engine's), SmolLM2-135M (9 heads over 3),
    Llama-3.2-1B (32 over 8) and a head-dim-128 model, with max_splits 1 (no merge) and with the
    splits one sequence gets from a graph's 128-column table (attention and merge kernels).
    sinks: instead, the attention kernel with attention sinks (HAS_SINKS, a constexpr: a compile
    of its own), split, at head dim 128 where registers run out first; the merge is the same
    kernel with or without them.
    `window` is a plain i32 in every case: the launcher never specializes it, so this one
    compile is what runs for full layers (0) and sliding ones alike.
    Each dict: name, kernel, signature, constexprs, num_warps, num_stages, and attrs: the
    params a real launch sees as multiples of 16 (every pointer, every stride), for
    ASTSource(attrs={(index,): [["tt.divisibility", 16]]}). They matter: without them the
    compiler cannot prove a K row 16-byte aligned, loads it element by element instead of by
    cp.async, and at head dim 128 spills registers."""
    page, table_width = 16, 128
    pointers = ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "part_o_ptr", "part_lse_ptr", "bt_ptr", "seq_lens_ptr",
                "query_start_ptr", "sinks_ptr"]
    strides = ["stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_ks", "stride_kh", "stride_bt"]
    cases = []
    for model, heads, kv_heads, head_dim in (("smollm2-135m", 9, 3, 64), ("llama-3.2-1b", 32, 8, 64),
                                             ("d128", 32, 8, 128)):
        if sinks and head_dim != 128:
            continue
        tiles = decode_tiles(capability, head_dim, torch.bfloat16)
        block_d = max(16, triton.next_power_of_2(head_dim))
        split = choose_max_splits(1, kv_heads, table_width)
        for max_splits in (split,) if sinks else (1, split):
            attention = {
                "HEAD_DIM": head_dim, "BLOCK_D": block_d, "GROUP": heads // kv_heads,
                "BLOCK_H": _heads_tile(heads // kv_heads),
                "PAGE": page, "BLOCK_N": tiles.block_n, "MAX_SPLITS": max_splits,
                "MIN_KEYS": tiles.min_keys_per_split, "HAS_QUERY_START": True, "DOT_16BIT": True, "HAS_SINKS": sinks,
            }
            signature = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16",
                         "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "bt_ptr": "*i64", "seq_lens_ptr": "*i64",
                         "query_start_ptr": "*i64", "sinks_ptr": "*fp32" if sinks else "*i64",  # unread without sinks
                         "qk_scale": "fp32", "window": "i32"}
            signature |= {name: "i32" for name in strides} | {name: "constexpr" for name in attention}
            cases.append({"name": f"decode {model} splits={max_splits}{' sinks' if sinks else ''}",
                          "kernel": _grouped_decode_kernel, "signature": signature, "constexprs": attention,
                          "num_warps": tiles.num_warps, "num_stages": tiles.num_stages, "attrs": pointers + strides})
            if max_splits == 1 or sinks:
                continue
            merge = {"HEAD_DIM": head_dim, "BLOCK_D": block_d, "MAX_SPLITS": max_splits,
                     "BLOCK_S": triton.next_power_of_2(max_splits), "MIN_KEYS": tiles.min_keys_per_split,
                     "BLOCK_N": tiles.block_n, "HAS_QUERY_START": True}
            signature = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "o_ptr": "*bf16", "seq_lens_ptr": "*i64",
                         "query_start_ptr": "*i64", "window": "i32", "stride_ot": "i32", "stride_oh": "i32"}
            signature |= {name: "constexpr" for name in merge}
            cases.append({"name": f"decode merge {model} splits={max_splits}", "kernel": _merge_splits_kernel,
                          "signature": signature, "constexprs": merge, "num_warps": 4, "num_stages": 1,
                          "attrs": [name for name in signature if name not in merge and name != "window"]})
    return cases


def sink_compile_cases(capability: tuple[int, int] = (9, 0)) -> list[dict]:
    """The decode kernel with attention sinks, for the compile report (compile_cases(sinks=True))."""
    return compile_cases(capability, sinks=True)
