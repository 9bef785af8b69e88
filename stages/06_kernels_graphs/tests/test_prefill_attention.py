"""The varlen paged attention kernel against the PyTorch oracle, under Triton's interpreter
on CPU (compiled on a GPU). Pools are NaN-poisoned and outputs start as NaN, so a stray read
or a missed write shows up as NaN."""
import pytest
import torch
from course.s06_kernels_graphs.prefill_attention import BLOCK_M, varlen_paged_attention
from course.s06_kernels_graphs.bench.testing import assert_matches_reference, make_paged_case, nan_like, reference_attention


def _run(case, **kw):
    return varlen_paged_attention(case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                                  case.block_tables, case.max_query_len, **kw)


def _check(case, tol, **kw):
    return assert_matches_reference(_run(case, out=nan_like(case.q), **kw), case, tol, kw.get("scale"))


@pytest.mark.parametrize("seq_lens, query_lens", [
    ([19, 7], [19, 7]),                 # whole prompts, odd lengths, partial last blocks
    ([23, 30], [5, 17]),                # chunks after a cached prefix (18 and 13: not block multiples)
    ([21, 9, 33, 4], [6, 1, 1, 4]),     # mixed: prefill chunks beside single-token decodes
])
@pytest.mark.parametrize("block_size", [1, 16])
def test_ragged_batches_match_reference(seq_lens, query_lens, block_size):
    case = make_paged_case(seq_lens, query_lens, num_heads=4, num_kv_heads=2, head_dim=16,
                           block_size=block_size, seed=block_size)
    _check(case, 1e-5)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(2, 2, 64), (6, 2, 12), (8, 1, 128)])  # GQA 1, 3, 8
def test_gqa_and_head_dims(num_heads, num_kv_heads, head_dim):
    case = make_paged_case([13, 6], [5, 1], num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, block_size=4, seed=head_dim)
    _check(case, 1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_dtypes(dtype, tol):
    case = make_paged_case([17, 11, 5], [9, 1, 5], num_heads=4, num_kv_heads=2, head_dim=64, block_size=4,
                           dtype=dtype, seed=3)
    _check(case, tol)


def test_custom_scale():
    case = make_paged_case([14, 8], [6, 8], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, seed=5)
    _check(case, 1e-5, scale=0.3)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_metadata_index_dtypes_and_out_buffer(index_dtype):
    case = make_paged_case([15, 10], [7, 1], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, seed=7)
    case.block_tables = case.block_tables.to(index_dtype)
    case.seq_lens = case.seq_lens.to(index_dtype)
    case.cu_seqlens_q = case.cu_seqlens_q.to(index_dtype)
    buf = nan_like(case.q)
    out = _run(case, out=buf)
    assert out is buf and torch.isfinite(buf).all()
    torch.testing.assert_close(out, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_long_query_beside_a_decode():
    """Three query tiles for one sequence, one for the other: its other programs exit at once."""
    long = 3 * BLOCK_M + 3
    case = make_paged_case([long + 4, 9], [long, 1], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4,
                           seed=11)
    _check(case, 1e-5)


def test_non_contiguous_q():
    case = make_paged_case([12, 5], [7, 5], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, seed=13)
    wide = torch.randn(case.q.shape[0], case.q.shape[1], 2 * case.q.shape[2])
    wide[..., ::2] = case.q
    case.q = wide[..., ::2]  # stride 2 along the head dim
    assert not case.q.is_contiguous()
    _check(case, 1e-5)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_stored_int8_pool_reads_as_the_oracle_reads_it_dequantized(block_size):
    from course.s06_kernels_graphs.bench.testing import stored_case

    case = make_paged_case([21, 9, 33, 4], [6, 1, 1, 4], num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=block_size, seed=block_size)
    k_pool, v_pool, dequantized = stored_case(case, torch.int8)
    got = varlen_paged_attention(case.q, k_pool.codes, v_pool.codes, case.cu_seqlens_q, case.seq_lens,
                                 case.block_tables, case.max_query_len, out=nan_like(case.q),
                                 k_scale=k_pool.scales, v_scale=v_pool.scales)
    torch.testing.assert_close(got, reference_attention(dequantized), atol=1e-5, rtol=1e-5)
