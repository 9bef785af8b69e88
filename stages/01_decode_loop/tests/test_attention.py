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
