"""The tensor-core decode kernel against the PyTorch oracle, under Triton's interpreter on the
CPU (compiled, in bf16, where there is a GPU). Pools are NaN past every sequence's length and
in every unused block, tables are shuffled and padded with a NaN block, and outputs start as
NaN (or a sentinel where rows must stay untouched), so a stray read or a missed write shows."""
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from functools import partial

import pytest
import torch
from course.s06_kernels_graphs.gpu import decode_attention as grouped
from course.s06_kernels_graphs.gpu.decode_attention import (
    DecodeTiles,
    choose_max_splits,
    decode_tiles,
    paged_decode_attention,
)
from course.s06_kernels_graphs.sync_guard import sync_guard
from course.s06_kernels_graphs.bench.testing import (check_decode, make_paged_case, nan_like, reference_attention,
                                                      run_decode, strided_q_and_out)

# Odd lengths, most ending mid-page; with the interpreter's 16-key splits, max_splits 4 gives
# these sequences 1, 1, 2 and 3 splits in the same launch.
LENS = [1, 7, 23, 41]


def _case(seq_lens=LENS, query_lens=None, **kw):
    kw = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64, "block_size": 4, "seed": 0} | kw
    return make_paged_case(seq_lens, query_lens or [1] * len(seq_lens), **kw)


_run = partial(run_decode, paged_decode_attention)
_check = partial(check_decode, paged_decode_attention)


def _cdiv(a, b):
    return -(-a // b)


def _splits(seq_len, max_splits, tiles):
    """The kernel's _request_splits on the host: (splits, keys per split) of one sequence."""
    want = min(max(_cdiv(seq_len, tiles.min_keys_per_split), 1), max_splits)
    per_split = max(_cdiv(_cdiv(seq_len, want), tiles.block_n) * tiles.block_n, tiles.block_n)
    return max(_cdiv(seq_len, per_split), 1), per_split


def test_split_counts_differ_per_request_and_leave_no_split_empty():
    tiles = decode_tiles(None, 64, torch.float32)
    assert [_splits(n, 4, tiles)[0] for n in LENS] == [1, 1, 2, 3]
    for n in range(1, 600):
        for cap in (1, 2, 3, 8, 32):
            splits, per_split = _splits(n, cap, tiles)
            assert 1 <= splits <= cap and (splits - 1) * per_split < n <= splits * per_split  # none empty
            assert splits == 1 or per_split >= min(tiles.min_keys_per_split, n)


def _decodes_only(case):
    """The rows of the sequences whose query length is 1, and a case of those sequences alone
    (the oracle's input: it has no use for prefill chunks or empty padding sequences)."""
    keep = [b for b, n in enumerate(case.query_lens) if n == 1]
    rows = [case.cu_seqlens_q[b].item() for b in keep]
    starts = torch.arange(len(keep) + 1, dtype=torch.int32)
    return rows, replace(case, q=case.q[rows], block_tables=case.block_tables[keep], seq_lens=case.seq_lens[keep],
                         cu_seqlens_q=starts, query_lens=[1] * len(keep))


@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (8, 2), (8, 1)])  # GQA groups 1, 4, 8
@pytest.mark.parametrize("head_dim, max_splits", [(64, 4), (128, 1)])
def test_gqa_groups_head_dims_and_splits_match_reference(num_heads, num_kv_heads, head_dim, max_splits):
    case = _case(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, seed=head_dim + num_heads)
    _check(case, max_splits=max_splits)


@pytest.mark.parametrize("block_size", [1, 16])
def test_pages_smaller_and_larger_than_a_tile(block_size):
    """A 16-key tile spans 16 one-token pages, or lies inside one 16-token page."""
    _check(_case(block_size=block_size, seed=block_size), max_splits=3)


@pytest.mark.parametrize("num_heads, head_dim", [(16, 80), (32, 48)])
def test_wide_groups_and_head_dims_not_a_power_of_two(num_heads, head_dim):
    """One KV head for 16 or 32 query heads (the head tile widens past 16), and D padded to 128 / 64."""
    _check(_case([5, 20], num_heads=num_heads, num_kv_heads=1, head_dim=head_dim, seed=num_heads), max_splits=2)


def test_more_splits_allowed_than_any_sequence_needs(monkeypatch):
    """max_splits 8: the grid has 8 splits per sequence, each sequence uses 1 to 3 of them.
    The scratch starts as NaN, so a merge that read a split nobody wrote would show."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    case = _case(seed=8)
    torch.testing.assert_close(_check(case, max_splits=8), _run(case, max_splits=1), atol=1e-6, rtol=1e-5)


def test_one_split_launches_no_merge(monkeypatch):
    monkeypatch.setattr(grouped, "_merge_splits_kernel", None)  # any launch would raise
    _check(_case(seed=1), max_splits=1)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_16bit_pools_match_the_fp32_reference(dtype, tol):
    _check(_case(dtype=dtype, seed=3), tol, max_splits=3)


def test_custom_scale():
    _check(_case(seed=5), scale=0.3, max_splits=2)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_int32_and_int64_tables_into_an_out_buffer(index_dtype):
    case = _case(seed=9)
    case.block_tables = case.block_tables.to(index_dtype)
    case.seq_lens = case.seq_lens.to(index_dtype)
    buf = nan_like(case.q)
    assert _run(case, out=buf, max_splits=3) is buf and torch.isfinite(buf).all()
    torch.testing.assert_close(buf, reference_attention(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_splits", [1, 3])
def test_query_start_attends_only_decodes_and_leaves_other_rows_untouched(max_splits):
    """A mixed step: prefill chunks (query lengths 5 and 3), padding sequences (length 0, no
    query rows) and decodes share q and out. Only the decodes' rows are written."""
    seq_lens, query_lens = [9, 20, 0, 33, 12, 0, 26], [1, 5, 0, 1, 3, 0, 1]
    case = _case(seq_lens, query_lens, num_heads=8, num_kv_heads=2, seed=11)
    case.block_tables = case.block_tables.long()
    sentinel = 123.0
    out = torch.full_like(case.q, sentinel)
    _run(case, query_start=case.cu_seqlens_q.long(), out=out, max_splits=max_splits)
    rows, decodes = _decodes_only(case)
    others = [r for r in range(case.q.shape[0]) if r not in rows]
    assert len(rows) == 3 and (out[others] == sentinel).all()
    torch.testing.assert_close(out[rows], reference_attention(decodes), atol=1e-5, rtol=1e-5)


def test_non_contiguous_q_and_out():
    case = _case([12, 5], seed=13)
    out = strided_q_and_out(case)
    got = _run(case, out=out, max_splits=2)
    assert got is out
    torch.testing.assert_close(out, reference_attention(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_splits", [1, 3])
def test_never_reads_tensor_values_on_the_host(max_splits):
    case = _case([9, 30], seed=17)
    starts = case.cu_seqlens_q.long()
    with sync_guard():  # what a CUDA graph capture would refuse
        out = _run(case, out=nan_like(case.q), max_splits=max_splits)
        _run(case, query_start=starts, out=out, max_splits=max_splits)
    torch.testing.assert_close(out, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_choose_max_splits():
    assert choose_max_splits(256, 8, 128) == 1  # 2,048 programs already keep 132 SMs 4 deep
    assert choose_max_splits(64, 8, 128) == 1  # 512 programs: close enough
    assert choose_max_splits(32, 8, 128) == 2
    assert choose_max_splits(1, 8, 128) == 32  # one long sequence: capped
    assert choose_max_splits(1, 8, 3) == 3  # no more splits than the table has blocks
    assert choose_max_splits(2, 4, 100, num_sms=16) == 8


def test_decode_tiles():
    assert decode_tiles(None, 64, torch.float32).block_n == 16  # the interpreter: small tiles
    for capability in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0)]:
        for head_dim in (64, 128):
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                tiles = decode_tiles(capability, head_dim, dtype)
                assert isinstance(tiles, DecodeTiles)
                assert tiles.block_n in (32, 64, 128) and tiles.num_stages in (2, 3)
                assert tiles.min_keys_per_split % tiles.block_n == 0
    assert decode_tiles((9, 0), 64, torch.bfloat16).block_n == 128
    assert decode_tiles((9, 0), 128, torch.bfloat16) == DecodeTiles(64, 4, 3, 256)


_COMPILE = """
import os, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course.s06_kernels_graphs.gpu.decode_attention import compile_cases
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for case in compile_cases():
    if "merge" in case["name"] or "splits=1" in case["name"] or "smollm2" in case["name"]:
        continue
    kernel = case["kernel"]
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in case["attrs"]}
    source = ASTSource(fn=kernel, signature=case["signature"], constexprs=case["constexprs"], attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=case["num_warps"], num_stages=case["num_stages"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"]); cubin.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True).stdout
    ttgir = compiled.asm["ttgir"]
    print(case["name"], "|", "warp_group_dot" in ttgir, ttgir.count("async_copy_global_to_local"),
          compiled.metadata.shared, "|", " ".join(line.strip() for line in usage.splitlines() if "REG:" in line))
"""


def test_sm90_compile_uses_wgmma_async_copies_and_no_spills():
    """The attention kernel compiled for sm_90 without a GPU (a few seconds): both products are
    warpgroup MMAs, K/V tiles arrive by cp.async, nothing spills to the stack, and the shared
    memory fits an H100. gpu/compile_report.py reports every kernel of the stage."""
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_COMPILE)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2  # Llama-3.2-1B (head dim 64) and head dim 128, split
    for line in lines:
        name, facts, usage = line.split(" | ")
        wgmma, async_copies, shared = facts.split()
        assert wgmma == "True" and int(async_copies) > 0 and int(shared) <= 227 * 1024, line
        assert "STACK:0 " in usage and "LOCAL:0 " in usage, line  # no register spills


# ---- on a GPU: the same equalities, compiled ---------------------------------------------------

def _gpu_case(num_heads=32, num_kv_heads=8, head_dim=64, dtype=torch.bfloat16):
    """Lengths that take 1, 1, 3, 4 and 8 splits of 256 keys when 8 are allowed."""
    return make_paged_case([1, 77, 513, 1000, 2049], [1] * 5, num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, block_size=16, dtype=dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(9, 3, 64), (32, 8, 64), (32, 8, 128), (8, 8, 128)])
@pytest.mark.parametrize("max_splits", [1, 8])
def test_compiled_bf16_kernel_matches_reference(num_heads, num_kv_heads, head_dim, max_splits):
    _check(_gpu_case(num_heads, num_kv_heads, head_dim), 3e-2, max_splits=max_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 3e-3)])
def test_compiled_fp32_and_fp16_kernels_match_reference(dtype, tol):
    _check(_gpu_case(dtype=dtype), tol, max_splits=8)


@pytest.mark.gpu
@pytest.mark.parametrize("max_splits", [1, 8])
def test_compiled_query_start_leaves_other_rows_untouched(max_splits):
    seq_lens, query_lens = [300, 700, 0, 1500, 64], [1, 40, 0, 1, 64]
    case = make_paged_case(seq_lens, query_lens, num_heads=32, num_kv_heads=8, head_dim=64, block_size=16,
                           dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(case.q, 7.0)
    _run(case, query_start=case.cu_seqlens_q, out=out, max_splits=max_splits)
    rows, decodes = _decodes_only(case.cpu())
    others = [r for r in range(case.q.shape[0]) if r not in rows]
    assert rows == [0, 41] and (out[others] == 7.0).all()
    torch.testing.assert_close(out[rows].float().cpu(), reference_attention(decodes), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
def test_compiled_kernel_replays_from_a_cuda_graph():
    case = make_paged_case([5, 300, 2000], [1] * 3, num_heads=32, num_kv_heads=8, head_dim=64, block_size=16,
                           dtype=torch.bfloat16, device="cuda")
    out = nan_like(case.q)
    _run(case, out=out, max_splits=16)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(case, out=out, max_splits=16)
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out.float().cpu(), reference_attention(case.cpu()), atol=3e-2, rtol=3e-2)
