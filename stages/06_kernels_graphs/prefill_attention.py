"""Varlen paged attention: prefill chunks and decodes of a ragged batch in one launch.

FlashAttention-2's idea: each program owns a tile of BLOCK_M queries and walks the keys in
tiles of BLOCK_N, keeping per row only a running max m, a running sum l and an unnormalised
output acc. When a later tile raises the max, the old l and acc are rescaled by exp(m_old -
m_new) (online softmax), so the T x L score matrix is never built, only one BLOCK_M x BLOCK_N
tile of it at a time, in registers.

Everything else is bookkeeping. A sequence's new tokens are its last qlen positions; a cached
prefix is just keys before the first query, read like any other key, and a decode is a query
of length 1. Keys come from the paged pool through the block table, token by token, so a key
tile may span several pages and any block size works. int8 codes: as in decode_attention.py.

A sliding layer's window bounds the walk from below as causality bounds it from above: the
key loop starts at the tile's first query's window.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_attention import rotate_rows, rotation, scale_value

BLOCK_M = BLOCK_N = 16  # interpreter-friendly tiles (a GPU's: 64-128 x 64); every tl.dot dim stays >= 16


@triton.jit(do_not_specialize=["window"])  # one kernel for every window (0: none)
def _varlen_paged_attn_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, o_ptr, cu_ptr, seq_lens_ptr, bt_ptr, sinks_ptr, scale, window,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od, stride_kb, stride_ks, stride_kh, stride_bt,
    rot_norm, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_16BIT: tl.constexpr, QUANTIZED: tl.constexpr,
    HAS_SINKS: tl.constexpr, LOG2_ROT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_ptr + b).to(tl.int64)
    q_len = tl.load(cu_ptr + b + 1).to(tl.int64) - q_start
    if tile * BLOCK_M >= q_len:  # the grid is sized for the longest query; shorter ones stop here
        return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    prefix = seq_len - q_len  # cached tokens before the first query

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM  # head dim padded to a power of two >= 16 for tl.dot
    q_pos = prefix + offs_m  # absolute positions: query at p sees keys 0..p,
    first_key = tl.where(window > 0, q_pos - window + 1, 0)  # in a sliding layer none before p - window + 1
    rows = q_start + offs_m  # int64: T * stride can pass 2**31
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :] * stride_qd,
                mask=m_ok[:, None] & d_ok[None, :], other=0.).to(tl.float32)  # fp32 at once
    q = rotate_rows(q, LOG2_ROT) * rot_norm if QUANTIZED else q  # a quantized pool's rows are rotated

    kv_off = (h // GROUP).to(tl.int64) * stride_kh  # GQA: GROUP query heads share one kv head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys past the tile's last query, or before its first query's window, are never needed.
    key_end = tl.minimum(prefix + tl.minimum((tile + 1) * BLOCK_M, q_len), seq_len)
    key_start = tl.maximum(tl.where(window > 0, prefix + tile * BLOCK_M - window + 1, 0), 0)
    for start in range(key_start, key_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < key_end
        # Each key finds its page through the table; entries past the sequence's are garbage: masked.
        page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = page * stride_kb + (offs_n % PAGE) * stride_ks + kv_off
        kv_mask = n_ok[:, None] & d_ok[None, :]  # never unmasked: 0 * NaN from a stray slot is NaN
        k = tl.load(k_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.).to(tl.float32)
        v = tl.load(v_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.).to(tl.float32)
        if QUANTIZED:  # codes times their row's scale (one per token and KV head: at slot / HEAD_DIM)
            k = k * scale_value(tl.load(ks_ptr + slot // HEAD_DIM, mask=n_ok, other=0))[:, None]
            v = v * scale_value(tl.load(vs_ptr + slot // HEAD_DIM, mask=n_ok, other=0))[:, None]

        if DOT_16BIT:  # GPU, 16-bit queries: tensor-core dots in their dtype, fp32 accumulators
            s = tl.dot(q.to(q_ptr.dtype.element_ty), tl.trans(k.to(q_ptr.dtype.element_ty))) * scale
        else:  # fp32 inputs, or the interpreter (whose 16-bit arithmetic is wrong): exact fp32 dots
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] >= first_key[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with no visible key yet (a later row, before its window) keeps max -inf;
        # subtracting 0 instead keeps exp() at 0 rather than exp(-inf - -inf) = NaN.
        m_safe = tl.where(m_new == float("-inf"), 0., m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)  # rescale what earlier tiles accumulated
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_16BIT:
            pv = tl.dot(p.to(q_ptr.dtype.element_ty), v.to(q_ptr.dtype.element_ty))
        else:
            pv = tl.dot(p, v, input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if HAS_SINKS:  # the head's sink (gpt-oss): one more logit in every row's sum, with no value
        sink = tl.load(sinks_ptr + h)
        m_new = tl.maximum(m_i, sink)  # finite, even in a row that saw no key
        alpha = tl.exp(m_i - m_new)
        acc, l_i = acc * alpha[:, None], l_i * alpha + tl.exp(sink - m_new)
    acc = acc / tl.where(l_i > 0., l_i, 1.)[:, None]
    acc = rotate_rows(acc, LOG2_ROT) * rot_norm if QUANTIZED else acc  # back from the values' rotation
    tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :] * stride_od,
             acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def varlen_paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_query_len: int,
                           scale=None, out=None, k_scale=None, v_scale=None,
                           window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [T, H, D] (sequence b's rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its
    last positions) over its seq_lens[b] keys in the paged pool [num_blocks, block_size, Hkv, D]
    (int8: with its scale bytes k/v_scale [num_blocks, block_size, Hkv]), in a sliding layer its last `window`
    positions, with gpt-oss's `sinks` [H]. Returns [T, H, D] in q's dtype."""
    T, H, D = q.shape
    _, page, hkv, _ = k_cache.shape
    assert H % hkv == 0 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert window is None or window >= 1, f"a window holds at least the query itself, not {window}"
    assert k_scale is None or (k_cache.dtype == torch.int8 and k_scale.is_contiguous() and v_scale.is_contiguous())
    assert block_tables.is_contiguous()
    if scale is None:
        scale = D ** -0.5
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    batch = seq_lens.shape[0]
    if T == 0 or batch == 0:
        return out
    grid = (batch, H, triton.cdiv(max_query_len, BLOCK_M))
    _varlen_paged_attn_kernel[grid](
        q, k_cache, v_cache, k_cache if k_scale is None else k_scale, v_cache if v_scale is None else v_scale,
        out, cu_seqlens_q, seq_lens, block_tables, q if sinks is None else sinks.float().contiguous().view(H),
        float(scale), window or 0, q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), **rotation(D),
        HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), PAGE=page, GROUP=H // hkv,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HAS_SINKS=sinks is not None,
        DOT_16BIT=q.is_cuda and q.dtype in (torch.float16, torch.bfloat16), QUANTIZED=k_scale is not None,
    )
    return out
