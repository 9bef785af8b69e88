"""Attention sinks (gpt-oss) in the room's kernels, under the interpreter (compiled, in bf16, on a GPU).

A sink is one learned logit per query head that joins its head's softmax sum with no value behind
it. Both kernels fold it in after their walk, in log2 units as their scores, and are held to stage
01's causal_attention(..., window, sinks) with sinks far above every score, far below, and mixed
across heads, with and without a sliding window, over pools whose unowned slots (and, in a window,
the keys well before it) are NaN. The decode kernel adds a sink in split 0 alone, and the merge
must weigh it in once: its scratch starts as NaN here. A sequence with no key (length 0) gets the
sink's weight and no value: zeros, never NaN."""
from functools import partial

import pytest
import torch

from course.s06_kernels_graphs.bench.testing import (fresh_kv, make_paged_case, nan_like, poison_before_window,
                                                     reference_attention, run_decode)
from course.s06_kernels_graphs.gpu.decode_attention import decode_tiles, paged_decode_attention
from course.s06_kernels_graphs.gpu.prefill_attention import prefill_tiles, varlen_attention
from course.s06_kernels_graphs.sync_guard import sync_guard

_decode = partial(run_decode, paged_decode_attention)  # into a NaN-filled out

TILE = max(decode_tiles(None, 64, torch.float32).block_n, prefill_tiles(None, 64, torch.float32).block_n)
# 8 query heads over 2 KV heads: a group of 4, padded to 16 columns in the decode kernel.
SINKS = {
    "positive": torch.tensor([6.0, 4.0, 9.0, 5.0, 7.0, 3.0, 8.0, 4.5]),  # above every score (|q.k| / 8 ~ 1)
    "negative": torch.tensor([-6.0, -4.0, -9.0, -3.0, -7.0, -5.0, -8.0, -2.5]),  # the softmax barely changes
    "mixed": torch.tensor([8.0, -7.0, 0.0, 1.5, -2.0, 20.0, -0.5, 3.0]),  # 20: almost all weight on no key
}
LENS = [0, 1, 7, 23, 41, 70]
# Chunks over cached prefixes (20 and 2 keys), decodes, a padding sequence (no query), a whole
# 33-token prompt (three query tiles) and a 40-token chunk over 30 cached keys.
CHUNKS = ([26, 9, 0, 33, 7, 70, 21], [6, 1, 0, 33, 5, 40, 1])


@pytest.fixture
def nan_scratch(monkeypatch):
    """torch.empty filled with NaN: split scratch the merge reads without a split having written it shows."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


@pytest.mark.parametrize("max_splits", [1, 4])
@pytest.mark.parametrize("window", [None, 3, 21])
@pytest.mark.parametrize("sinks", sorted(SINKS))
def test_decode_with_sinks_equals_causal_attention(sinks, window, max_splits, nan_scratch):
    """With 4 splits the long sequences split (16 keys a split here), and the merge must add each
    head's sink once; length 0 is one split with no key: the sink alone, zeros."""
    case = make_paged_case(LENS, [1] * len(LENS), num_heads=8, num_kv_heads=2, head_dim=64, block_size=4,
                           seed=len(sinks) + (window or 0))
    want = reference_attention(case, window=window, sinks=SINKS[sinks])
    poison_before_window(case, window, TILE)
    got = _decode(case, max_splits=max_splits, window=window, sinks=SINKS[sinks])
    assert torch.isfinite(got).all() and (got[0] == 0).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, reference_attention(case, window=window), atol=1e-3)  # the sinks did change it


def test_every_split_count_gives_the_same_output(nan_scratch):
    """1 to 8 splits of a 70-key sequence (and of its 22-key window): split 0 alone adds the sink."""
    case = make_paged_case([70, 5, 41], [1] * 3, num_heads=8, num_kv_heads=1, head_dim=32, block_size=4, seed=3)
    for window in (None, 21):
        want = reference_attention(case, window=window, sinks=SINKS["mixed"])
        for max_splits in (1, 2, 3, 8):
            torch.testing.assert_close(_decode(case, max_splits=max_splits, window=window, sinks=SINKS["mixed"]),
                                       want, atol=1e-5, rtol=1e-5, msg=f"window {window}, {max_splits} splits")


@pytest.mark.parametrize("window", [None, 6, 21])
@pytest.mark.parametrize("sinks", sorted(SINKS))
def test_varlen_with_sinks_equals_causal_attention(sinks, window):
    """Every query tile, at the window's edge, inside it and on the diagonal, and the rows of a tile
    past its chunk (no key: folded with the sink too, never stored)."""
    case = make_paged_case(*CHUNKS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=4,
                           seed=len(sinks) + (window or 0))
    sink = SINKS[sinks][:4]
    want = reference_attention(case, window=window, sinks=sink)
    k, v = fresh_kv(case)
    poison_before_window(case, window, TILE)
    got = varlen_attention(case.q, k, v, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                           case.block_tables, out=nan_like(case.q), window=window, sinks=sink)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_mixed_step_of_both_kernels_with_sinks(window, nan_scratch):
    """The kernel set's mixed step: the varlen kernel on the chunks (skip_decodes), the decode
    kernel on the single-token rows (query_start), one out, bfloat16 sinks (a model's parameter,
    read as their float32 values); host reads refused (graph capture)."""
    case = make_paged_case(*CHUNKS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=4, seed=5)
    sinks = SINKS["mixed"][:4].to(torch.bfloat16)
    want = reference_attention(case, window=window, sinks=sinks)
    k, v = fresh_kv(case)
    out = torch.full_like(case.q, float("nan"))
    starts = case.cu_seqlens_q.long()
    with sync_guard():
        varlen_attention(case.q, k, v, case.k_cache, case.v_cache, starts, case.seq_lens, case.block_tables, out=out,
                         skip_decodes=True, window=window, sinks=sinks)
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                               query_start=starts, max_splits=3, out=out, window=window, sinks=sinks)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError, match="one sink per query head"):
        _decode(case, query_start=starts, sinks=sinks[:2])


# ---- on a GPU: the same equalities, compiled ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("max_splits", [1, 8])
def test_compiled_bf16_decode_with_sinks(window, max_splits):
    case = make_paged_case([1, 77, 513, 1000, 2049], [1] * 5, num_heads=64, num_kv_heads=8, head_dim=64,
                           block_size=16, dtype=torch.bfloat16, device="cuda")
    sinks = torch.linspace(-4.0, 6.0, 64, dtype=torch.bfloat16)  # gpt-oss-20b's 64 heads over 8
    want = reference_attention(case.cpu(), window=window, sinks=sinks)
    got = _decode(case, max_splits=max_splits, window=window, sinks=sinks.cuda())
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiled_bf16_varlen_with_sinks(window, head_dim):
    case = make_paged_case([300, 129, 64, 7, 4200], [300, 50, 1, 7, 256], num_heads=32, num_kv_heads=8,
                           head_dim=head_dim, block_size=16, dtype=torch.bfloat16, device="cuda")
    sinks = torch.linspace(-4.0, 6.0, 32, dtype=torch.bfloat16)
    want = reference_attention(case.cpu(), window=window, sinks=sinks)
    k, v = fresh_kv(case)
    got = varlen_attention(case.q, k, v, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                           case.block_tables, window=window, sinks=sinks.cuda())
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=3e-2)
