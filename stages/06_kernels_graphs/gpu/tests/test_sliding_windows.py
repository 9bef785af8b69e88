"""Sliding windows in the room's kernels, under the interpreter (compiled, in bf16, on a GPU).

In a sliding layer the query at position p sees keys p - window < j <= p. Both kernels are held
to stage 01's causal_attention with that window, for windows of 1 and 3 keys, shorter than a
page, spanning several pages and tiles, and longer than every sequence, on ragged batches
with sequences shorter and longer than the window. The kernels start at the window: keys more
than a tile before it are NaN here, and must never be read. Split-KV shares the window's keys,
not the sequence's, and the merge must agree with the attention kernel on how many splits
there are (its scratch starts as NaN)."""
from functools import partial

import pytest
import torch

from course.s06_kernels_graphs.bench.testing import (fresh_kv, make_paged_case, nan_like, poison_before_window,
                                                     reference_attention, run_decode)
from course.s06_kernels_graphs.gpu.decode_attention import decode_tiles, paged_decode_attention
from course.s06_kernels_graphs.gpu.prefill_attention import prefill_tiles, varlen_attention
from course.s06_kernels_graphs.sync_guard import sync_guard

_decode = partial(run_decode, paged_decode_attention)  # into a NaN-filled out

DECODE_TILE = decode_tiles(None, 64, torch.float32).block_n  # the interpreter's: 16 keys
PREFILL_TILE = prefill_tiles(None, 64, torch.float32).block_n
# 1 and 3 keys; 6: more than a 4-token page, less than a 16-key tile; 21: several pages and more
# than a tile; 200: longer than every sequence (the whole past, as without a window).
WINDOWS = [1, 3, 6, 21, 200]
LENS = [1, 7, 23, 41, 70]


@pytest.mark.parametrize("max_splits", [1, 4])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_attends_each_querys_window(window, block_size, max_splits):
    case = make_paged_case(LENS, [1] * len(LENS), num_heads=8, num_kv_heads=2, head_dim=64, block_size=block_size,
                           seed=window + block_size)
    want = reference_attention(case, window=window)
    assert poison_before_window(case, window, DECODE_TILE) > 0 or window == 200  # the long ones skip keys
    got = _decode(case, max_splits=max_splits, window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_splits_share_the_windows_keys_and_the_merge_agrees(monkeypatch):
    """70 keys, window 21: the walk starts at key 48 (a whole tile), so the 22 keys from there
    take 2 splits of 16, where the whole sequence would take 5. The scratch starts as NaN: a
    merge that counted the sequence's splits would read three nobody wrote."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    case = make_paged_case([70, 5, 41], [1] * 3, num_heads=8, num_kv_heads=1, head_dim=32, block_size=4, seed=3)
    want = reference_attention(case, window=21)
    for max_splits in (2, 8):
        torch.testing.assert_close(_decode(case, max_splits=max_splits, window=21), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_splits", [1, 3])
def test_query_start_with_a_window_leaves_other_rows_untouched(max_splits):
    seq_lens, query_lens = [9, 20, 0, 33, 12, 0, 26], [1, 5, 0, 1, 3, 0, 1]
    case = make_paged_case(seq_lens, query_lens, num_heads=8, num_kv_heads=2, head_dim=64, block_size=4, seed=11)
    want = reference_attention(case, window=4)
    out = torch.full_like(case.q, 123.0)
    _decode(case, query_start=case.cu_seqlens_q.long(), out=out, max_splits=max_splits, window=4)
    rows = [case.cu_seqlens_q[b].item() for b, n in enumerate(query_lens) if n == 1]
    others = [r for r in range(case.q.shape[0]) if r not in rows]
    assert (out[others] == 123.0).all()
    torch.testing.assert_close(out[rows], want[rows], atol=1e-5, rtol=1e-5)


def test_decode_window_of_a_whole_sequence_and_none_agree():
    case = make_paged_case(LENS, [1] * len(LENS), num_heads=8, num_kv_heads=2, head_dim=64, block_size=4, seed=5)
    full = _decode(case, max_splits=4)
    torch.testing.assert_close(_decode(case, max_splits=4, window=70), full, atol=1e-6, rtol=1e-6)
    with pytest.raises(AssertionError, match="at least the query itself"):
        _decode(case, window=0)


# Chunks over cached prefixes (20 and 2 keys), a whole 33-token prompt (three query tiles),
# decodes beside them, and a 40-token chunk over 30 cached keys.
CHUNKS = ([26, 9, 33, 7, 70, 21], [6, 1, 33, 5, 40, 1])


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_varlen_attends_each_querys_window(window, block_size):
    """The prefix's tiles at the window's edge, the chunk's tiles left of the diagonal at the
    edge, the diagonal itself (windows shorter than a query tile), and everything in between
    unmasked, for every query tile."""
    case = make_paged_case(*CHUNKS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=block_size,
                           seed=window + block_size)
    want = reference_attention(case, window=window)
    k, v = fresh_kv(case)
    poison_before_window(case, window, PREFILL_TILE)
    got = varlen_attention(case.q, k, v, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                           case.block_tables, out=nan_like(case.q), window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [3, 21])
def test_mixed_step_of_both_kernels_with_a_window(window):
    """The kernel set's mixed step: the varlen kernel on the chunks (skip_decodes), the decode
    kernel on the single-token rows (query_start), one out; host reads refused (graph capture)."""
    case = make_paged_case(*CHUNKS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=4, seed=window)
    want = reference_attention(case, window=window)
    k, v = fresh_kv(case)
    out = nan_like(case.q)
    starts = case.cu_seqlens_q.long()
    with sync_guard():
        varlen_attention(case.q, k, v, case.k_cache, case.v_cache, starts, case.seq_lens, case.block_tables, out=out,
                         skip_decodes=True, window=window)
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                               query_start=starts, max_splits=3, out=out, window=window)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


# ---- on a GPU: the same equalities, compiled ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("window", [3, 1000])
@pytest.mark.parametrize("max_splits", [1, 8])
def test_compiled_bf16_decode_with_a_window(window, max_splits):
    case = make_paged_case([1, 77, 513, 1000, 2049], [1] * 5, num_heads=32, num_kv_heads=8, head_dim=128,
                           block_size=16, dtype=torch.bfloat16, device="cuda")
    want = reference_attention(case.cpu(), window=window)
    got = _decode(case, max_splits=max_splits, window=window)
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [3, 1000])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiled_bf16_varlen_with_a_window(window, head_dim):
    """Query tiles of 128 rows: a window of 3 masks inside the diagonal; 1,000 spans tiles."""
    case = make_paged_case([300, 129, 64, 7, 4200], [300, 50, 1, 7, 256], num_heads=32, num_kv_heads=8,
                           head_dim=head_dim, block_size=16, dtype=torch.bfloat16, device="cuda")
    want = reference_attention(case.cpu(), window=window)
    k, v = fresh_kv(case)
    got = varlen_attention(case.q, k, v, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                           case.block_tables, window=window)
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=3e-2)
