"""The attention math against PyTorch's fused scaled_dot_product_attention."""
import pytest
import torch
import torch.nn.functional as F

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention, causal_attention


@pytest.mark.parametrize("tq,tk,h,hkv,d", [(1, 1, 4, 2, 8), (5, 5, 6, 3, 16), (3, 11, 9, 3, 64), (17, 17, 4, 1, 32)])
def test_attention_causal_matches_sdpa(tq, tk, h, hkv, d):
    g = torch.Generator().manual_seed(tq * 100 + tk)
    q, k, v = (torch.randn(t, n, d, generator=g) for t, n in [(tq, h), (tk, hkv), (tk, hkv)])
    q_start = tk - tq  # the queries are the last tq positions
    ours = causal_attention(q, k, v, q_start=q_start)
    mask = torch.arange(tk)[None, :] <= torch.arange(q_start, tk)[:, None]
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_attention_full_backend_rejects_cached_context():
    meta = AttentionMetadata(positions=torch.tensor([4]), cu_seqlens_q=torch.tensor([0, 1]),
                             seq_lens=torch.tensor([5]))
    q = torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="whole sequences"):
        FullCausalAttention().forward(0, q, q, q, meta)


def test_attention_metadata_for_full_sequences():
    meta = AttentionMetadata.for_full_sequences([3, 1, 2])
    assert meta.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert meta.cu_seqlens_q.tolist() == [0, 3, 4, 6]
    assert meta.query_lens.tolist() == meta.seq_lens.tolist() == [3, 1, 2]


@pytest.mark.parametrize("window", [1, 3, 8, 100])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_window_and_sinks_match_a_softmax_written_per_query(window, with_sinks):
    """Each query's softmax over exactly the keys j with q_pos - window < j <= q_pos, plus the
    head's sink logit in the denominator: written one query at a time, no mask tricks."""
    torch.manual_seed(0)
    tq, tk, h, hkv, d, start = 5, 12, 4, 2, 8, 7
    q, k, v = torch.randn(tq, h, d), torch.randn(tk, hkv, d), torch.randn(tk, hkv, d)
    sinks = torch.randn(h) if with_sinks else None
    out = causal_attention(q, k, v, q_start=start, window=window, sinks=sinks)
    for i in range(tq):
        pos = start + i
        keys = list(range(max(0, pos - window + 1), pos + 1))
        for head in range(h):
            kv = head // (h // hkv)
            logits = torch.stack([q[i, head] @ k[j, kv] for j in keys]) * d ** -0.5
            if with_sinks:
                logits = torch.cat([logits, sinks[head:head + 1]])
            p = logits.softmax(0)[:len(keys)]
            expected = sum(p[n] * v[j, kv] for n, j in enumerate(keys))
            torch.testing.assert_close(out[i, head], expected, atol=1e-5, rtol=1e-5)
