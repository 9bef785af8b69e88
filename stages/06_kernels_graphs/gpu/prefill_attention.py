"""Varlen causal attention for prefill chunks as FlashAttention-2, with a launch grid that
depends only on shapes.

The lesson's kernel (../prefill_attention.py) has the right algorithm: a program owns a tile
of queries and walks the keys with an online softmax. A GPU needs four more things from it
(a fifth and a sixth, sliding windows and attention sinks, come at the end).

1. Tensor cores, fed with 16-bit tiles of the right size. Hopper's wgmma multiplies 64 query
   rows per warpgroup, so a query tile is 64-128 rows (the lesson's 16 rows leave them idle).
   Q, K, V and the probabilities P enter both tl.dot products in bf16/fp16; the scores and the
   output accumulate in fp32. The lesson upcasts K and V to fp32 before the dot, which turns
   the tensor-core product into a slow fp32 one.
2. No mask where none is needed. Most tiles are full: every query of a chunk sees every key
   of the cached prefix, and every key of the chunk left of the diagonal. Those tiles run
   without a single comparison; only the prefix's last partial tile (masked by length) and the
   tiles on the diagonal (masked causally) pay for a mask.
3. The chunk's own keys from the fresh projection. The step has just computed k and v
   [T, Hkv, D] for its new tokens (and written them into the pool); reading them back through
   the block table would cost a page-id load per key and a gathered read. Here only the cached
   prefix goes through the table, and the chunk's keys are plain strided rows of k and v.
4. A grid that depends only on shapes. The lesson's grid has an axis of length
   cdiv(max_query_len, BLOCK_M), a number the host has to know, which breaks CUDA-graph capture
   of any step with a prefill chunk. Here the grid is (cdiv(T, BLOCK_M) + B, H), from the
   padded token count T and the number of sequences B alone, as vLLM's unified attention
   bounds it (q_tokens // BLOCK_Q + num_seqs). Sequence b's tiles are numbered from
   cu_seqlens_q[b] // BLOCK_M + b, an increasing sequence, so each program finds its
   (sequence, query tile) by a binary search over it on the device; programs past the work
   exit at once (x below):

     BLOCK_M = 4, cu_seqlens_q = [0, 6, 7, 7, 16]: a chunk of 6, a decode, a padding
     sequence, a chunk of 9; the grid has cdiv(16, 4) + 4 = 8 programs per head.

     first tile of b = cu[b] // 4 + b     0           2       3        4
     program                              0     1     2       3        4     5     6     7
     (sequence, tile)                   (0,0) (0,1) (1,0)  (2,0)x   (3,0) (3,1) (3,2) (3,3)x

   The programs are taken in reverse order, so that the last tiles of a chunk, which see the
   most keys, start first and the short ones fill in behind them.
5. Sliding windows. In a sliding layer the query at position p sees keys p - window < j <= p.
   For a tile of queries that bounds the keys from below as causality bounds them from above:
   key tiles wholly before the first row's window are skipped (a long sequence in a sliding
   layer costs its window, not its length); the few key tiles at the window's edge, seen by
   some rows of the tile and not others, are masked; every key tile between the edge and the
   diagonal is inside every row's window and runs unmasked, as before. `window` is a runtime
   int (0: no window) the launcher never specializes, so full and sliding layers share one
   compiled kernel; without a window the edge's loops are empty.
6. Attention sinks (gpt-oss). Head h's sink is one more logit in each of its rows' softmax
   sums, with no value behind it. After the walk the program folds it in as the online softmax
   folds a tile: M = max(m, sink), acc and l rescaled by 2^(m - M), l += 2^(sink - M) (the
   sink in log2 units, as the scores). A row that saw no key (m still at the floor) gets
   acc = 0 and l = 1: zeros, never NaN. HAS_SINKS is a constexpr: the kernel compiled without
   sinks holds no sink code at all.

The exponentials are exp2, with log2(e) folded into the scale on the host: one multiply per
score instead of the multiply inside exp. Tile sizes come from a small table keyed by compute
capability, head dim and dtype (prefill_tiles); autotuning would have to time candidates,
which syncs and cannot run during graph capture. Under the interpreter (no CUDA) the tiles are
16 x 16 and the dots run in exact fp32, because the interpreter's 16-bit arithmetic is not
faithful. compile_cases() lists the kernel at the stage's shapes for the sm_90 compile report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)
SINK_LOG2E = tl.constexpr(LOG2E)  # the same, for a kernel (a global it reads must be a constexpr)


@dataclass(frozen=True)
class PrefillTiles:
    block_m: int     # query rows per program (a multiple of block_n)
    block_n: int     # keys per inner iteration
    num_warps: int
    num_stages: int  # how many K/V tiles the pipeliner keeps in flight


def prefill_tiles(capability: tuple[int, int] | None, head_dim: int, dtype: torch.dtype) -> PrefillTiles:
    """Tile sizes for one card. capability None is the interpreter. Every GPU entry was compiled
    here for sm_90 and sm_80 at head dims 64 and 128 and checked for register spills and for
    shared memory (compile_cases() gives the bf16 ones)."""
    if capability is None:
        return PrefillTiles(16, 16, 4, 1)
    if head_dim > 128:  # a 256-wide fp32 accumulator spills at every tile size tried
        raise ValueError(f"no prefill tiles checked for head dim {head_dim} (at most 128)")
    if dtype == torch.float32:  # exact fp32 dots, no tensor cores: larger tiles spill
        return PrefillTiles(64, 32, 8, 2) if head_dim <= 64 else PrefillTiles(16, 16, 4, 2)
    if capability[0] >= 9:
        # Hopper: two warpgroups of 64 rows for wgmma. sm_90, bf16: head dim 64 needs 166
        # registers and 64 KB of shared memory, head dim 128 254 registers and 128 KB (the
        # card has 227 KB); neither spills.
        return PrefillTiles(128, 64, 8, 3)
    # Ampere and Ada (mma.sync, 100-164 KB of shared memory). At head dim 128 a 64 x 64 tile on
    # 4 warps spills on sm_80; 128 rows on 8 warps with 32-key tiles does not (203 registers).
    if head_dim > 64:
        return PrefillTiles(128, 32, 8, 2)
    return PrefillTiles(64, 64, 4, 2)


@triton.jit
def _find_tile(cu_ptr, work_id, num_seqs, BLOCK_M: tl.constexpr):
    """The sequence whose tiles contain tile number work_id: the last b with
    cu_seqlens_q[b] // BLOCK_M + b <= work_id (the numbering increases with b)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_ptr + mid) // BLOCK_M + mid
        if first_tile <= work_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_rows(ptrs, row_ok, ROW_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               DOT_16BIT: tl.constexpr):
    """A [rows, BLOCK_D] tile, masked only where it must be: rows past a length (ROW_MASK), and
    a head dim padded up to a power of two (never for 64 or 128)."""
    if HEAD_DIM == BLOCK_D:
        if ROW_MASK:
            x = tl.load(ptrs, mask=row_ok[:, None], other=0.)
        else:
            x = tl.load(ptrs)
    else:
        d_ok = tl.arange(0, BLOCK_D) < HEAD_DIM
        if ROW_MASK:
            x = tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.)
        else:
            x = tl.load(ptrs, mask=d_ok[None, :], other=0.)
    if not DOT_16BIT:  # fp32 inputs, or the interpreter: exact fp32 dots
        x = x.to(tl.float32)
    return x


@triton.jit
def _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale,
                         MASKED: tl.constexpr, DOT_16BIT: tl.constexpr):
    """Fold one tile of keys into the running (acc, max, sum), all in log2 units. `visible`
    [rows, keys] is read only when MASKED."""
    if DOT_16BIT:
        s = tl.dot(q, tl.trans(k))  # 16-bit inputs, fp32 accumulator
    else:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    s = s * qk_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    # The running max starts at a finite floor (M_FLOOR), never -inf: a row that sees no key of
    # a tile (one before its window) keeps m_new = floor, p = exp2(-inf - floor) = 0 and
    # alpha = 1, never exp2(-inf - -inf) = NaN, and no guard is needed.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)  # rescale what earlier tiles accumulated
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_16BIT:
        acc = tl.dot(p.to(v.dtype), v, acc)
    else:
        acc = tl.dot(p, v, acc, input_precision="ieee")
    return acc, m_new, l_i


# The running max's start: below every real score (|q.k| * scale is far smaller), above -inf
# (see _online_softmax_step). A constexpr, as a global a kernel reads must be.
M_FLOOR = tl.constexpr(-1.0e30)


@triton.jit(do_not_specialize=["window"])  # one compiled kernel for full (0) and sliding layers
def _varlen_attention_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, o_ptr,
    cu_ptr, seq_lens_ptr, bt_ptr, sinks_ptr, qk_scale, window, num_seqs,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_16BIT: tl.constexpr, SKIP_DECODES: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    # Reversed: the highest tile numbers are the last tiles of the last sequence, the heaviest.
    work_id = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    b = _find_tile(cu_ptr, work_id, num_seqs, BLOCK_M)
    q_start = tl.load(cu_ptr + b).to(tl.int64)
    q_len = tl.load(cu_ptr + b + 1).to(tl.int64) - q_start
    tile = work_id - (q_start // BLOCK_M + b)
    if tile * BLOCK_M >= q_len:  # past this sequence's tiles, or a padding sequence (q_len 0)
        return
    if SKIP_DECODES:
        if q_len == 1:  # the decode kernel owns this row
            return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    prefix = seq_len - q_len  # cached tokens before the first query

    m0 = tile * BLOCK_M  # first query row of the tile, within the chunk
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    rows = q_start + offs_m  # int64: rows * stride can pass 2**31
    q = _load_rows(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], m_ok, True,
                   HEAD_DIM, BLOCK_D, DOT_16BIT)

    kvh = (h // GROUP).to(tl.int64)  # GQA: GROUP query heads share one kv head
    m_i = tl.full([BLOCK_M], M_FLOOR, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # The window, in positions. Row m of the chunk (position prefix + m) sees keys from
    # prefix + first[m] on. Without one, a window that reaches back to key 0 from every row of
    # the tile: every bound below then falls on 0 and the window's edge loops are empty.
    win = tl.where(window > 0, window, prefix + m0 + BLOCK_M)
    first = offs_m - win + 1  # chunk-relative: negative reaches into the prefix
    lo = tl.maximum(prefix + m0 - win + 1, 0)  # the tile's first row's first key: nothing before is read
    edge_end = tl.maximum(prefix + m0 + BLOCK_M - win, 0)  # from here on, every row's window holds the key

    # 1. The cached prefix, from the pool through the block table. Tiles before the window are
    #    skipped, tiles at its edge masked by it; the others are seen by every query of the
    #    tile, so they need no mask at all. The last partial tile is masked by length.
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    cache_off = kvh * stride_ch + offs_d[None, :]
    full_end = (prefix // BLOCK_N) * BLOCK_N
    edge_start = (lo // BLOCK_N) * BLOCK_N
    free_start = tl.minimum(tl.maximum(tl.cdiv(edge_end, BLOCK_N) * BLOCK_N, edge_start), full_end)
    for start in range(edge_start, free_start, BLOCK_N):  # the window's edge (none without a window)
        offs_n = start + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + offs_n // PAGE).to(tl.int64)
        slot = (page * stride_cb + (offs_n % PAGE) * stride_cs)[:, None] + cache_off
        k = _load_rows(k_cache_ptr + slot, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_cache_ptr + slot, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        visible = offs_n[None, :] >= (prefix + first)[:, None]
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale, True, DOT_16BIT)
    for start in range(free_start, full_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + offs_n // PAGE).to(tl.int64)
        slot = (page * stride_cb + (offs_n % PAGE) * stride_cs)[:, None] + cache_off
        k = _load_rows(k_cache_ptr + slot, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_cache_ptr + slot, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, 0, qk_scale, False, DOT_16BIT)
    for start in range(tl.maximum(full_end, lo), prefix, BLOCK_N):  # runs once if the prefix ends mid-tile
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < prefix  # past it, table entries and pool slots may hold anything
        page = tl.load(bt_row + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = (page * stride_cb + (offs_n % PAGE) * stride_cs)[:, None] + cache_off
        k = _load_rows(k_cache_ptr + slot, n_ok, True, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_cache_ptr + slot, n_ok, True, HEAD_DIM, BLOCK_D, DOT_16BIT)
        visible = n_ok[None, :] & (offs_n[None, :] >= (prefix + first)[:, None])
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale, True, DOT_16BIT)

    # 2. The chunk's own keys, rows of the fresh k and v, in chunk positions. Keys left of the
    #    tile's first query are seen by all its rows (no mask) unless at the window's edge;
    #    the tiles on the diagonal are masked causally (and by the window).
    k_rows = k_ptr + q_start * stride_kt + kvh * stride_kh + offs_d[None, :]
    v_rows = v_ptr + q_start * stride_vt + kvh * stride_vh + offs_d[None, :]
    offs_tile = tl.arange(0, BLOCK_N)
    edge_start = (tl.maximum(lo - prefix, 0) // BLOCK_N) * BLOCK_N  # <= m0: a row sees itself
    free_start = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(edge_end - prefix, 0), BLOCK_N) * BLOCK_N, edge_start), m0)
    for start in range(edge_start, free_start, BLOCK_N):  # the window's edge (none without a window)
        offs_n = start + offs_tile
        k = _load_rows(k_rows + offs_n[:, None] * stride_kt, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_rows + offs_n[:, None] * stride_vt, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        visible = offs_n[None, :] >= first[:, None]
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale, True, DOT_16BIT)
    for start in range(free_start, m0, BLOCK_N):
        k = _load_rows(k_rows + (start + offs_tile)[:, None] * stride_kt, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_rows + (start + offs_tile)[:, None] * stride_vt, 0, False, HEAD_DIM, BLOCK_D, DOT_16BIT)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, 0, qk_scale, False, DOT_16BIT)
    diagonal_end = tl.minimum(m0 + BLOCK_M, q_len)
    for start in range(m0, diagonal_end, BLOCK_N):
        offs_n = start + offs_tile
        n_ok = offs_n < q_len
        k = _load_rows(k_rows + offs_n[:, None] * stride_kt, n_ok, True, HEAD_DIM, BLOCK_D, DOT_16BIT)
        v = _load_rows(v_rows + offs_n[:, None] * stride_vt, n_ok, True, HEAD_DIM, BLOCK_D, DOT_16BIT)
        visible = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] >= first[:, None]) & n_ok[None, :]
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale, True, DOT_16BIT)

    if HAS_SINKS:  # the head's sink: one more term in every row's sum, with no value
        sink = tl.load(sinks_ptr + h) * SINK_LOG2E  # in log2 units, as the scores
        m_new = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_new)  # 0 for a row still at M_FLOOR
        acc, l_i = acc * alpha[:, None], l_i * alpha + tl.math.exp2(sink - m_new)
    # A real row sees at least itself; a row past the chunk, in a sliding layer, may see no key.
    acc = acc / tl.where(l_i > 0., l_i, 1.)[:, None]
    out_ptrs = o_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        tl.store(out_ptrs, acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])
    else:
        tl.store(out_ptrs, acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


def _capability(t: torch.Tensor) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else None


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()  # the kernel reads head dims as contiguous rows


def varlen_attention(q, k, v, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, *,
                     scale=None, out=None, skip_decodes=False, window: int | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [T, H, D] for a ragged batch of chunks. Sequence b's queries are
    rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its last positions; its keys are the cached prefix
    (seq_lens[b] - query length of them) in the pool k_cache, v_cache [num_blocks, page, Hkv, D]
    through block_tables [B, W], then its own new keys, rows of k, v [T, Hkv, D]. Sequences of
    query length 0 (padding), rows past cu_seqlens_q[B] and, with skip_decodes, sequences of
    query length 1 are left untouched. window: a sliding layer's window, each query sees its
    last `window` positions only and keys before every query's window are never read (None:
    its whole past). sinks: gpt-oss's [H] logits, one per query head (any float dtype), each one
    more term in its head's softmax with no value (None: none). Returns [T, H, D] in q's dtype,
    into `out` if given.
    Only shapes reach the host, so the call can be captured in a CUDA graph."""
    T, H, D = q.shape
    _, page, hkv, _ = k_cache.shape
    assert H % hkv == 0 and k.shape == v.shape == (T, hkv, D)
    assert window is None or window >= 1, f"a window holds at least the query itself, not {window}"
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.stride(1) == 1
    assert sinks is None or sinks.shape == (H,), f"one sink per query head ({H}), not {tuple(sinks.shape)}"
    if scale is None:
        scale = D ** -0.5
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    assert out.stride(-1) == 1
    batch = seq_lens.shape[0]
    if T == 0 or batch == 0:
        return out
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    block_d = max(16, triton.next_power_of_2(D))  # tl.dot wants dims >= 16; a power of two for arange
    tiles = prefill_tiles(_capability(q), block_d, q.dtype)
    grid = (triton.cdiv(T, tiles.block_m) + batch, H)
    has_sinks = sinks is not None
    sinks = sinks.float().contiguous() if has_sinks else seq_lens  # fp32 (a parameter's own if it is fp32)
    _varlen_attention_kernel[grid](
        q, k, v, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables, sinks, float(scale) * LOG2E,
        window or 0, batch,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=D, BLOCK_D=block_d, PAGE=page, GROUP=H // hkv, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        DOT_16BIT=q.is_cuda and q.dtype in (torch.float16, torch.bfloat16), SKIP_DECODES=skip_decodes,
        HAS_SINKS=has_sinks,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return out


# The shapes the stage launches: (name, query heads, kv heads, head dim), bf16, page 16.
COMPILE_SHAPES = [("smollm2-135m", 9, 3, 64), ("llama-3.2-1b", 32, 8, 64), ("head-dim-128", 32, 8, 128)]


def compile_cases(capability: tuple[int, int] = (9, 0), sinks: bool = False) -> list[dict]:
    """The kernel at the stage's shapes, with the tiles varlen_attention picks on `capability`,
    for triton.compile (see gpu/compile_report.py). 'attrs' marks the arguments the launcher
    specializes as divisible by 16 (pointers and strides of aligned, contiguous tensors), so
    the compile sees what a real launch sees. `window` is a plain i32, never specialized by the
    launcher: this one compile serves full layers (0) and sliding ones. sinks: instead, the kernel
    with attention sinks (HAS_SINKS, a constexpr: a compile of its own) at head dim 128, where
    registers run out first."""
    pointers = ["q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "o_ptr"]
    strides = ["stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_ot",
               "stride_oh", "stride_cb", "stride_cs", "stride_ch"]
    arg_names = _varlen_attention_kernel.arg_names
    cases = []
    for name, heads, kv_heads, head_dim in COMPILE_SHAPES[-1:] if sinks else COMPILE_SHAPES:
        tiles = prefill_tiles(capability, head_dim, torch.bfloat16)
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, PAGE=16, GROUP=heads // kv_heads, BLOCK_M=tiles.block_m,
                          BLOCK_N=tiles.block_n, DOT_16BIT=True, SKIP_DECODES=True, HAS_SINKS=sinks)
        signature = {**{p: "*bf16" for p in pointers}, "cu_ptr": "*i64", "seq_lens_ptr": "*i64",
                     "bt_ptr": "*i64", "sinks_ptr": "*fp32" if sinks else "*i64",  # unread without sinks
                     "qk_scale": "fp32", "window": "i32", "num_seqs": "i32",
                     **{s: "i32" for s in strides}, "stride_bt": "i32", **{c: "constexpr" for c in constexprs}}
        aligned = pointers + ["cu_ptr", "seq_lens_ptr", "bt_ptr", "sinks_ptr"] + strides
        cases.append(dict(
            name=f"varlen_attention[{name} H{heads}/{kv_heads} D{head_dim}{', sinks' if sinks else ''}]",
            kernel=_varlen_attention_kernel,
            signature={a: signature[a] for a in arg_names}, constexprs=constexprs,
            attrs={(arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned},
            num_warps=tiles.num_warps, num_stages=tiles.num_stages))
    return cases


def sink_compile_cases(capability: tuple[int, int] = (9, 0)) -> list[dict]:
    """The kernel with attention sinks, for the compile report (compile_cases(sinks=True))."""
    return compile_cases(capability, sinks=True)
