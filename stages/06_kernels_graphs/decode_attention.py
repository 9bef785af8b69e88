"""Paged decode attention: one new token per sequence, K/V read straight from the paged pool.

A decode step has one query per sequence, so the work is a walk over that sequence's cached
keys, found block by block through its block table (vLLM's layout), with an online softmax:
a running max m, a running sum l and an unnormalised output acc, rescaled by exp(m_old - m_new)
whenever the max grows. Nothing is gathered into a contiguous copy first.

GQA: the G = H / Hkv query heads that share a KV head are served by ONE program, so each K/V
tile is read from memory once for the whole group. G is 1..8, too small for tl.dot's 16-row
minimum, so q.k is an elementwise broadcast and a tl.sum.

Split-K (FlashDecoding): with few sequences there are too few programs to fill the GPU, so
each sequence's table is cut into S column ranges, one program each; each writes its partial
output and log-sum-exp, and a second small kernel merges them (rescaling by exp(lse - max)).

An int8 pool (stage 03's quantized_kv.py) is read as it lies: a key's scale byte multiplies its
scores, a value's its softmax weights. Its rows are rotated (Walsh-Hadamard): so is the query
going in (q . k = Hq . Hk) and the output coming out (sum p Hv = H sum p v).

A sliding layer's query sees its last `window` keys only: the walk starts at the tile that
holds the first, which alone masks keys, so a long sequence costs its window, not its length.

Everything on the host comes from tensor shapes, never values, so the call is graph-capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 16  # keys per loop iteration; each finds its page in the table, so any block size works


@triton.jit
def scale_value(byte):  # a scale byte e << 4 | m as 2^(e - 12) * (1 + m/16) (stage 03's quantized_kv.py)
    b = byte.to(tl.int32)
    return (((b >> 4) + 115) << 23 | (b & 15) << 19).to(tl.float32, bitcast=True)


@triton.jit
def rotate_rows(x, LOG2_BLOCK: tl.constexpr):  # x [R, C] by quantized_kv.rotate's butterflies, in its order, unscaled
    for i in tl.static_range(LOG2_BLOCK):  # pairs h = 2^i apart: (a + b, a - b)
        a, b = tl.split(tl.permute(tl.reshape(x, [x.shape[0], x.shape[1] // (2 << i), 2, 1 << i]), [0, 1, 3, 2]))
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2]), x.shape)
    return x


def rotation(head_dim: int) -> dict:  # the rotation's block (the largest power of two in head_dim): log2, 1/sqrt
    return {"rot_norm": (head_dim & -head_dim) ** -0.5, "LOG2_ROT": (head_dim & -head_dim).bit_length() - 1}


@triton.jit(do_not_specialize=["window"])  # a full layer (0) and a sliding one share one kernel
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, o_ptr, part_o_ptr, part_lse_ptr, bt_ptr, seq_lens_ptr, sinks_ptr,
    scale, window, stride_qb, stride_qh, stride_qd, stride_ob, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_btb, stride_btw, cols_per_split, rot_norm,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, QUANTIZED: tl.constexpr, HAS_SINKS: tl.constexpr,
    LOG2_ROT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)  # read on the device: no host sync

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok = offs_g < GROUP  # G and D padded to powers of two, masked back
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g  # the query heads that share this KV head
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=g_ok[:, None] & d_ok[None, :], other=0.).to(tl.float32)  # fp32 at once
    q = (rotate_rows(q, LOG2_ROT) * rot_norm if QUANTIZED else q) * scale  # a quantized pool's rows are rotated

    # This split's keys: table columns [split * cols, (split + 1) * cols), clipped to the sequence
    # and to the window, from the tile holding its first key (whole tiles: a start at any key
    # costs registers, spills at head dim 128 with int8 pools).
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)  # the first key the query sees
    lo = split * cols_per_split * PAGE
    lo += (tl.maximum(first - lo, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum((split + 1) * cols_per_split * PAGE, seq_len)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):  # empty for a split past the sequence's end or before its window
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi  # table padding and a partial page's NaN tail are never read
        page = tl.load(bt_ptr + b * stride_btb + (offs_n // PAGE) * stride_btw, mask=n_ok, other=0)
        slot = page.to(tl.int64) * stride_kb + (offs_n % PAGE) * stride_ks + kvh * stride_kh  # int64: pools pass 2**31
        kv_mask = n_ok[:, None] & d_ok[None, :]  # never unmasked: 0 * NaN is NaN
        k = tl.load(k_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.).to(tl.float32)
        v = tl.load(v_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.).to(tl.float32)

        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, N]: q.k for every head of the group
        if QUANTIZED:  # an int8 key's scale (one per token and KV head: at slot / HEAD_DIM) scales its scores
            s = s * scale_value(tl.load(ks_ptr + slot // HEAD_DIM, mask=n_ok, other=0))[None, :]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        if start < first:  # the window's first tile (never without a window): hide the keys before it
            s = tl.where(offs_n[None, :] >= first, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0., m_new)  # exp(-inf - -inf) would be NaN
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)  # rescale what earlier tiles accumulated
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if QUANTIZED:  # and a value's, its weights
            p = p * scale_value(tl.load(vs_ptr + slot // HEAD_DIM, mask=n_ok, other=0))[None, :]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new

    if HAS_SINKS:  # gpt-oss: each head's sink, one more logit in its sum with no value,
        if split == 0:  # counted once: the reduce adds the splits' sums, each weighed by its lse
            sink = tl.load(sinks_ptr + heads, mask=g_ok, other=0.)
            m_new = tl.maximum(m_i, sink)  # finite, even in a split that saw no key
            alpha = tl.exp(m_i - m_new)
            acc, l_i, m_i = acc * alpha[:, None], l_i * alpha + tl.exp(sink - m_new), m_new
    acc = acc / tl.where(l_i > 0., l_i, 1.)[:, None]
    acc = rotate_rows(acc, LOG2_ROT) * rot_norm if QUANTIZED else acc  # a split's too: the reduce is linear
    out_mask = g_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 acc.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:  # scratch is contiguous fp32 [B, H, S, D] and [B, H, S]; an empty split writes lse = -inf
        lse = tl.where(l_i > 0., m_i + tl.log(tl.where(l_i > 0., l_i, 1.)), float("-inf"))
        row = (b * (tl.num_programs(1) * GROUP) + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
        tl.store(part_lse_ptr + row, lse, mask=g_ok)


@triton.jit
def _reduce_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    d_ok = offs_d < HEAD_DIM
    row = (b * tl.num_programs(1) + h) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + row, mask=s_ok, other=float("-inf"))
    o = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.)
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0., m)  # the split of the last key holds a token, but never make NaN
    w = tl.exp(lse - m)  # an empty split (lse = -inf) weighs exactly 0
    o = tl.sum(w[:, None] * o, axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(o_ptr.dtype.element_ty), mask=d_ok)


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, num_splits=1,
                           out=None, block_n=BLOCK_N, num_warps=None, k_scale=None, v_scale=None,
                           window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of each sequence's one query q[b] [H, D] over its seq_lens[b] keys in the paged pool
    k/v_cache [num_blocks, block_size, Hkv, D] through block_tables[b]: [B, H, D] in q's dtype, into
    `out` if given. num_splits > 1: split-K + reduce. An int8 pool comes with its scale bytes k/v_scale
    [num_blocks, block_size, Hkv]; a sliding layer, its `window`; gpt-oss, its `sinks` [H]. block_n,
    num_warps: tuning knobs (bench/tune_decode.py)."""
    B, H, D = q.shape
    _, page, hkv, _ = k_cache.shape
    assert H % hkv == 0 and k_cache.is_contiguous() and v_cache.is_contiguous() and num_splits >= 1
    assert window is None or window >= 1, f"a window holds at least the query itself, not {window}"
    assert k_scale is None or (k_cache.dtype == torch.int8 and k_scale.is_contiguous() and v_scale.is_contiguous())
    if scale is None:
        scale = D ** -0.5
    if out is None:
        out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    width = block_tables.shape[1]
    num_splits = min(num_splits, width)  # more splits than columns would only add empty ones
    group = H // hkv
    block_d = triton.next_power_of_2(D)
    if num_splits > 1:  # fp32 scratch; every element is written by some split, so no fill
        part_o = torch.empty((B, H, num_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused: the single pass writes `out` directly
    launch = {} if num_warps is None else {"num_warps": num_warps}
    _decode_kernel[(B, hkv, num_splits)](
        q, k_cache, v_cache, k_cache if k_scale is None else k_scale, v_cache if v_scale is None else v_scale,
        out, part_o, part_lse, block_tables, seq_lens, q if sinks is None else sinks.float().contiguous().view(H),
        float(scale), window or 0, q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), block_tables.stride(1),
        triton.cdiv(width, num_splits), **rotation(D),
        HEAD_DIM=D, BLOCK_D=block_d, GROUP=group, BLOCK_G=triton.next_power_of_2(group), PAGE=page,
        NUM_SPLITS=num_splits, BLOCK_N=block_n, QUANTIZED=k_scale is not None, HAS_SINKS=sinks is not None, **launch,
    )
    if num_splits > 1:
        _reduce_kernel[(B, H)](
            part_o, part_lse, out, out.stride(0), out.stride(1), out.stride(2),
            HEAD_DIM=D, BLOCK_D=block_d, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
        )
    return out


# Programs per SM to aim for before splitting stops paying: measured on an H200 with
# bench/tune_decode.py (B=32 at 2,048 tokens, 256 programs: 428 us unsplit, 287 us with 2 splits).
PROGRAMS_PER_SM = 4


def choose_num_splits(batch_size: int, num_kv_heads: int, max_blocks: int, num_sms: int = 132) -> int:
    """How many splits per sequence keep the GPU busy (FlashDecoding; vLLM's PagedAttention v2).

    Without splits a decode launches batch_size * num_kv_heads programs. One program per SM is
    not enough: each walks its keys one dependent tile after another, so an SM needs several
    in flight to hide memory latency (PROGRAMS_PER_SM, measured). Below that, split each
    sequence to reach it, but never into more splits than it has blocks (a split with no keys
    is wasted), nor more than 16 (the reduce and scratch grow with S while the gain flattens)."""
    programs = max(1, batch_size * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    return max(1, min(target // programs, max_blocks, 16))
