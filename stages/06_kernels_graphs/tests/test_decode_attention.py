"""The paged decode kernel against the PyTorch oracle, under Triton's interpreter on CPU
(compiled on a GPU). Pools are NaN-poisoned past every sequence's tokens, tables are shuffled
and padded with a NaN block, and outputs start as NaN, so a stray read or a missed write shows."""
from functools import partial

import pytest
import torch
from course.s06_kernels_graphs.decode_attention import (
    choose_num_splits,
    paged_decode_attention,
)
from course.s06_kernels_graphs.sync_guard import sync_guard
from course.s06_kernels_graphs.bench.testing import (check_decode, make_paged_case, nan_like, reference_attention,
                                                      run_decode, strided_q_and_out)

_run = partial(run_decode, paged_decode_attention)
_check = partial(check_decode, paged_decode_attention)


def _case(seq_lens, **kw):
    kw = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "block_size": 4, "seed": 0} | kw
    return make_paged_case(seq_lens, [1] * len(seq_lens), **kw)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_odd_lengths_and_partial_blocks_match_reference(block_size, num_splits):
    case = _case([1, 5, 17, 33], block_size=block_size, seed=block_size)
    _check(case, num_splits=num_splits)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(2, 2, 64), (6, 2, 12), (8, 1, 128)])  # GQA 1, 3, 8
def test_gqa_ratios_and_head_dims_match_reference(num_heads, num_kv_heads, head_dim):
    case = _case([13, 6], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, seed=head_dim)
    _check(case)
    _check(case, num_splits=2)


@pytest.mark.parametrize("dtype, tol, num_splits", [(torch.float32, 1e-5, 3), (torch.float16, 2e-3, 1),
                                                    (torch.bfloat16, 2e-2, 3)])
def test_dtypes_match_reference(dtype, tol, num_splits):
    case = _case([17, 11, 5], num_heads=6, num_kv_heads=2, head_dim=64, dtype=dtype, seed=3)
    _check(case, tol, num_splits=num_splits)


@pytest.mark.parametrize("block_n, num_splits", [(32, 1), (128, 3)])
def test_tile_size_and_warps_knobs_match_reference(block_n, num_splits):
    """bench/tune_decode.py's knobs: a tile wider than a page (and than a short sequence) still masks
    every key past the end; num_warps changes the launch only."""
    case = _case([1, 5, 40, 130], block_size=4, seed=block_n)
    _check(case, num_splits=num_splits, block_n=block_n, num_warps=2)


def test_custom_scale():
    _check(_case([14, 8], seed=5), scale=0.3)
    _check(_case([14, 8], seed=5), scale=0.3, num_splits=2)


def test_more_splits_than_blocks_leave_empty_splits_harmless():
    """Width 4 (3 blocks + padding): 8 splits are more than the table has columns, and the
    1- and 5-token sequences leave most splits with no tokens at all (lse = -inf)."""
    case = _case([1, 5, 12], seed=7)
    _check(case, num_splits=8)
    _check(case, num_splits=4)


@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_split_k_equals_single_pass(num_splits):
    case = _case([40, 3, 21], num_heads=8, num_kv_heads=1, head_dim=32, seed=num_splits)
    one = _run(case, out=None)  # the kernel's own output
    torch.testing.assert_close(_run(case, num_splits=num_splits), one, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("index_dtype, num_splits", [(torch.int32, 1), (torch.int64, 2)])
def test_int32_and_int64_tables_and_out_buffer(index_dtype, num_splits):
    case = _case([15, 10], seed=9)
    case.block_tables = case.block_tables.to(index_dtype)
    case.seq_lens = case.seq_lens.to(index_dtype)
    buf = nan_like(case.q)
    out = _run(case, out=buf, num_splits=num_splits)
    assert out is buf and torch.isfinite(buf).all()
    torch.testing.assert_close(out, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_non_contiguous_q_and_out():
    case = _case([12, 5], seed=13)
    out = strided_q_and_out(case)
    assert not case.q.is_contiguous() and not out.is_contiguous()
    for splits in (1, 2):
        got = _run(case, out=out, num_splits=splits)
        torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)


class _RefuseHostReads(torch.overrides.TorchFunctionMode):
    """Raises on every Python-level host read of a tensor: .item(), .tolist(), bool(t), int(t).

    Triton's interpreter moves launch arguments between host and "device" itself, which could
    have tripped this check from inside triton's code; in triton 3.9 it calls none of these
    methods, so no caller filtering is needed and the check covers the whole call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in {"item", "tolist", "__bool__", "__int__", "__index__", "__float__"}:
            raise AssertionError(f"Tensor.{name} called: a host sync, which a CUDA graph cannot capture")
        return func(*args, **(kwargs or {}))


def test_host_read_guard_catches_a_sync():
    lens = torch.tensor([3, 4])
    for read in (lambda: lens.max().item(), lens.tolist, lambda: int(lens[0]), lambda: bool(lens[0] > 0)):
        with _RefuseHostReads(), pytest.raises(AssertionError, match="host sync"):
            read()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_never_reads_tensor_values_on_the_host(num_splits):
    case = _case([9, 2], seed=17)
    with _RefuseHostReads():
        out = _run(case, out=nan_like(case.q), num_splits=num_splits)
    with sync_guard():  # the stage's own guard also sees aten-level reads (_local_scalar_dense)
        _run(case, out=out, num_splits=num_splits)
    torch.testing.assert_close(out, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_choose_num_splits():
    assert choose_num_splits(256, 8, 64) == 1  # 2048 programs already fill 132 SMs, 4 deep
    assert choose_num_splits(528, 1, 64) == 1
    assert choose_num_splits(132, 1, 64) == 4  # one program per SM hides no latency
    assert choose_num_splits(32, 8, 128) == 2  # 256 programs: tune_decode's B=32 row
    assert choose_num_splits(1, 8, 256) > 1  # one long sequence: 8 programs on 132 SMs
    assert choose_num_splits(1, 1, 1000) == 16  # capped at 16
    assert choose_num_splits(1, 8, 3) == 3  # no more splits than blocks
    assert choose_num_splits(2, 4, 100, num_sms=16) == 8


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, block_size", [(4, 2, 16, 4), (6, 2, 12, 1), (9, 3, 64, 16)])
def test_a_stored_int8_pool_reads_as_the_oracle_reads_it_dequantized(num_heads, num_kv_heads, head_dim, block_size,
                                                              num_splits):
    """Codes and their scales loaded in the tile, scaled in registers: the oracle's output over
    the same pool dequantized (stored_case poisons every slot no sequence owns)."""
    from course.s06_kernels_graphs.bench.testing import stored_case

    case = _case([1, 5, 17, 33], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                 block_size=block_size, seed=head_dim)
    k_pool, v_pool, dequantized = stored_case(case, torch.int8)
    got = paged_decode_attention(case.q, k_pool.codes, v_pool.codes, case.block_tables, case.seq_lens,
                                 num_splits=num_splits, out=nan_like(case.q), k_scale=k_pool.scales,
                                 v_scale=v_pool.scales)
    torch.testing.assert_close(got, reference_attention(dequantized), atol=1e-5, rtol=1e-5)
