"""The FlashAttention-2 varlen kernel against the PyTorch oracle, under Triton's interpreter on
the CPU (its 16 x 16 tiles), compiled on a GPU (the `gpu` tests), and compiled for sm_90 here.

Pools are NaN wherever no sequence keeps a token and outputs start as NaN, so a stray read or
a missed write shows up. The chunk's own keys come from the fresh k, v: poisoning their pool
slots must change nothing."""
import os
import subprocess
import sys

import pytest
import torch
from course.s06_kernels_graphs.gpu.prefill_attention import (
    compile_cases,
    prefill_tiles,
    varlen_attention,
)
from course.s06_kernels_graphs.bench.testing import assert_matches_reference, make_paged_case, nan_like, reference_attention

INTERPRETER_BLOCK = prefill_tiles(None, 64, torch.float32).block_m  # 16 rows, 16 keys


def _new_token_slots(case):
    """Flat pool slot (block * page + offset) of every new token, in query-row order."""
    page = case.k_cache.shape[1]
    slots = []
    for b, (total, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens)):
        for p in range(total - new, total):
            slots.append(case.block_tables[b, p // page].item() * page + p % page)
    return torch.tensor(slots, dtype=torch.long)


def _fresh_kv(case):
    """The step's own k, v [T, Hkv, D]: what the projection produced and the step wrote to the pool."""
    slots = _new_token_slots(case)
    return case.k_cache.flatten(0, 1)[slots].clone(), case.v_cache.flatten(0, 1)[slots].clone()


def _run(case, k=None, v=None, **kw):
    if k is None:
        k, v = _fresh_kv(case)
    kw.setdefault("out", nan_like(case.q))
    return varlen_attention(case.q, k, v, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                            case.block_tables, **kw)


def _check(case, tol=1e-5, **kw):
    return assert_matches_reference(_run(case, **kw), case, tol, kw.get("scale"))


@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 1), (8, 1)])  # GQA groups 1, 4, 8
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gqa_and_head_dims(num_heads, num_kv_heads, head_dim):
    # a whole 37-token prompt (ends mid-page), and a 13-token chunk over a 24-token prefix
    case = make_paged_case([37, 37], [37, 13], num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, block_size=16, seed=head_dim + num_heads)
    _check(case)


@pytest.mark.parametrize("head_dim", [12, 80])
def test_head_dims_padded_to_a_power_of_two(head_dim):
    case = make_paged_case([30, 19], [11, 19], num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=4,
                           seed=head_dim)
    _check(case)


@pytest.mark.parametrize("block_size", [1, 16])
def test_prefix_plus_diagonal(block_size):
    """A 3-tile chunk over a 21-token prefix: full prefix tiles unmasked, the prefix's partial
    tile masked, tiles left of the diagonal unmasked, diagonal tiles masked causally."""
    qlen = 2 * INTERPRETER_BLOCK + 7
    case = make_paged_case([21 + qlen], [qlen], num_heads=4, num_kv_heads=2, head_dim=16, block_size=block_size,
                           seed=block_size)
    _check(case)


def test_several_chunks_and_decodes_in_one_batch():
    case = make_paged_case([40, 9, 33, 60, 5, 18], [12, 1, 1, 20, 1, 18], num_heads=4, num_kv_heads=2,
                           head_dim=32, block_size=4, seed=3)
    _check(case)


def test_skip_decodes_leaves_decode_rows_to_the_decode_kernel():
    case = make_paged_case([40, 9, 33, 21], [12, 1, 20, 1], num_heads=4, num_kv_heads=2, head_dim=32,
                           block_size=4, seed=4)
    out = _run(case, skip_decodes=True)
    want = reference_attention(case)
    decode_rows = [12, 33]  # cu_seqlens_q = [0, 12, 13, 33, 34]
    chunk_rows = [r for r in range(case.q.shape[0]) if r not in decode_rows]
    assert torch.isnan(out[decode_rows]).all()
    torch.testing.assert_close(out[chunk_rows], want[chunk_rows], atol=1e-5, rtol=1e-5)


def test_padding_sequences_and_rows_past_the_batch_are_untouched():
    """A graph bucket's padding: sequences of query length 0 (one between two chunks, one at the
    end) and rows past cu_seqlens_q[B]. Their table rows point at a NaN block and their k, v
    rows are NaN: a program that read them would turn NaN, one that wrote them would clear it."""
    case = make_paged_case([30, 19], [14, 19], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, seed=5)
    want = reference_attention(case)
    k, v = _fresh_kv(case)
    t, pad_rows = case.q.shape[0], 21  # two more query tiles' worth of padding rows
    poison_row = case.block_tables[:1, -1:].expand(1, case.block_tables.shape[1])  # the NaN block
    cu = case.cu_seqlens_q.tolist()
    case.cu_seqlens_q = torch.tensor([cu[0], cu[1], cu[1], cu[2], cu[2]], dtype=torch.int32)
    case.seq_lens = torch.tensor([30, 7, 19, 5], dtype=torch.int32)
    case.block_tables = torch.cat([case.block_tables[:1], poison_row, case.block_tables[1:], poison_row])
    case.q = torch.cat([case.q, torch.randn(pad_rows, *case.q.shape[1:])])
    k = torch.cat([k, torch.full((pad_rows, *k.shape[1:]), float("nan"))])
    v = torch.cat([v, torch.full((pad_rows, *v.shape[1:]), float("nan"))])
    out = _run(case, k, v)
    torch.testing.assert_close(out[:t], want, atol=1e-5, rtol=1e-5)
    assert torch.isnan(out[t:]).all()


def test_chunk_keys_come_from_the_fresh_projection():
    """Poison the pool slots of the chunk's own tokens: the cached prefix is still read through
    the table, the chunk's keys from k, v, and the result is unchanged."""
    case = make_paged_case([45, 26], [20, 26], num_heads=4, num_kv_heads=1, head_dim=32, block_size=4, seed=6)
    want = reference_attention(case)
    k, v = _fresh_kv(case)
    slots = _new_token_slots(case)
    for pool in (case.k_cache, case.v_cache):
        pool.view(-1, *pool.shape[2:])[slots] = float("nan")
    out = _run(case, k, v)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_views_of_a_fused_projection_and_custom_scale():
    """q, k, v as the engine slices them out of one [T, (H + 2 Hkv) * D] projection: strided rows."""
    case = make_paged_case([25, 12], [9, 12], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, seed=7)
    k, v = _fresh_kv(case)
    t = case.q.shape[0]
    fused = torch.cat([case.q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    case.q = fused[:, :64].view(t, 4, 16)
    k, v = fused[:, 64:96].view(t, 2, 16), fused[:, 96:].view(t, 2, 16)
    assert not case.q.is_contiguous()
    out = _run(case, k, v, scale=0.2)
    torch.testing.assert_close(out, reference_attention(case, scale=0.2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_16_bit_inputs(dtype, tol):
    case = make_paged_case([29, 11, 40], [17, 1, 40], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                           dtype=dtype, seed=8)
    _check(case, tol)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_index_dtypes_and_out_buffer(index_dtype):
    case = make_paged_case([23, 10], [7, 10], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, seed=9)
    case.block_tables = case.block_tables.to(index_dtype)
    case.seq_lens, case.cu_seqlens_q = case.seq_lens.to(index_dtype), case.cu_seqlens_q.to(index_dtype)
    buf = nan_like(case.q)
    assert _run(case, out=buf) is buf
    torch.testing.assert_close(buf, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_tile_table():
    interp = prefill_tiles(None, 128, torch.bfloat16)
    assert (interp.block_m, interp.block_n) == (16, 16)
    for head_dim in (64, 128):
        hopper = prefill_tiles((9, 0), head_dim, torch.bfloat16)
        assert 64 <= hopper.block_m <= 128 and hopper.block_m % 64 == 0 and hopper.num_warps % 4 == 0
        for cap in ((8, 0), (8, 9), (9, 0)):
            tiles = prefill_tiles(cap, head_dim, torch.float16)
            assert tiles.block_m % tiles.block_n == 0 and tiles.block_n >= 16 and tiles.num_stages >= 2
        fp32 = prefill_tiles((9, 0), head_dim, torch.float32)
        assert fp32.block_m % fp32.block_n == 0 and fp32.block_n >= 16
    with pytest.raises(ValueError):
        prefill_tiles((9, 0), 256, torch.bfloat16)


def test_compile_cases_use_the_tile_table():
    cases = compile_cases((9, 0))
    assert len(cases) == 3
    for case in cases:
        tiles = prefill_tiles((9, 0), case["constexprs"]["HEAD_DIM"], torch.bfloat16)
        assert (case["constexprs"]["BLOCK_M"], case["constexprs"]["BLOCK_N"]) == (tiles.block_m, tiles.block_n)
        assert (case["num_warps"], case["num_stages"]) == (tiles.num_warps, tiles.num_stages)
        assert list(case["signature"]) == list(case["kernel"].arg_names)


_SM90_CHECK = r"""
import os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course.s06_kernels_graphs.gpu.prefill_attention import compile_cases
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for case in compile_cases((9, 0))[-1:]:  # head dim 128: the most registers and shared memory
    src = ASTSource(fn=case["kernel"], signature=case["signature"], constexprs=case["constexprs"],
                    attrs=case["attrs"])
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=case["num_warps"], num_stages=case["num_stages"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs, stack, local = (int(re.search(key + r":(\d+)", usage).group(1)) for key in ("REG", "STACK", "LOCAL"))
    print(case["name"], ck.asm["ttgir"].count("ttng.warp_group_dot "), ck.metadata.shared, regs, stack, local)
"""


def test_sm90_compile_uses_wgmma_without_spills(tmp_path):
    """Compiled for an H100 here, without one: both products on wgmma, shared memory under the
    card's 227 KB, no register spills (no stack, no local memory). The head-dim-128 shape only,
    the tightest; gpu/compile_report.py compiles every case."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _SM90_CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.rsplit(" ", 5) for line in run.stdout.strip().splitlines()]
    assert len(rows) == 1
    for name, dots, shared, regs, stack, local in rows:
        assert int(dots) >= 8, name  # QK^T and PV in each of the four key loops
        assert int(shared) <= 227 * 1024, name
        assert int(regs) <= 255 and int(stack) == 0 and int(local) == 0, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 3e-2), (torch.float32, 1e-4)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("skip_decodes", [False, True])
def test_compiled_kernel_matches_reference(dtype, tol, head_dim, skip_decodes):
    """Tensor-core tiles on the GPU (bf16), exact fp32 dots (fp32): chunks over cached prefixes,
    a whole prompt, decodes."""
    case = make_paged_case([300, 129, 64, 7, 4200], [300, 50, 1, 7, 256], num_heads=32, num_kv_heads=8,
                           head_dim=head_dim, block_size=16, dtype=dtype, device="cuda")
    out = _run(case, skip_decodes=skip_decodes).float().cpu()
    want = reference_attention(case.cpu())
    decode_row = 350  # cu_seqlens_q = [0, 300, 350, 351, 358, 614]
    if skip_decodes:
        assert torch.isnan(out[decode_row]).all()
        out[decode_row] = want[decode_row]
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)


@pytest.mark.gpu
def test_compiled_kernel_leaves_padding_untouched():
    case = make_paged_case([130, 77], [70, 77], num_heads=9, num_kv_heads=3, head_dim=64, block_size=16,
                           dtype=torch.bfloat16, device="cuda")
    want = reference_attention(case.cpu())
    k, v = _fresh_kv(case)
    t, pad_rows = case.q.shape[0], 200
    cu = case.cu_seqlens_q.tolist()
    case.cu_seqlens_q = torch.tensor(cu + [cu[-1]] * 3, dtype=torch.long, device="cuda")  # 3 padding sequences
    case.seq_lens = torch.cat([case.seq_lens, torch.ones(3, dtype=case.seq_lens.dtype, device="cuda")]).long()
    case.block_tables = torch.cat([case.block_tables, case.block_tables[:1, -1:].expand(3, case.block_tables.shape[1])]).long()
    case.q = torch.cat([case.q, torch.randn(pad_rows, *case.q.shape[1:], device="cuda", dtype=case.q.dtype)])
    k = torch.cat([k, torch.full((pad_rows, *k.shape[1:]), float("nan"), device="cuda", dtype=k.dtype)])
    v = torch.cat([v, torch.full((pad_rows, *v.shape[1:]), float("nan"), device="cuda", dtype=v.dtype)])
    out = _run(case, k, v).float().cpu()
    torch.testing.assert_close(out[:t], want, atol=3e-2, rtol=3e-2)
    assert torch.isnan(out[t:]).all()


@pytest.mark.gpu
def test_one_captured_graph_serves_any_split_of_the_same_shapes():
    """The grid depends only on T and B: a graph captured for one batch replays correctly for
    another with the same shapes but other chunk lengths, prefixes and decodes."""
    dev = dict(dtype=torch.bfloat16, device="cuda")
    kw = dict(num_heads=32, num_kv_heads=8, head_dim=64, block_size=16, **dev)
    cases = [make_paged_case([300, 64, 90], [200, 1, 40], seed=1, **kw),  # T = 241 in both
             make_paged_case([100, 250, 33], [100, 140, 1], seed=2, **kw)]
    fresh = [_fresh_kv(case) for case in cases]
    width = max(case.block_tables.shape[1] for case in cases)
    blocks = max(case.k_cache.shape[0] for case in cases)
    static = dict(q=torch.empty_like(cases[0].q), k=torch.empty_like(fresh[0][0]), v=torch.empty_like(fresh[0][1]),
                  k_cache=torch.zeros(blocks, *cases[0].k_cache.shape[1:], **dev),
                  v_cache=torch.zeros(blocks, *cases[0].v_cache.shape[1:], **dev),
                  cu=torch.zeros(4, dtype=torch.long, device="cuda"),
                  seq_lens=torch.zeros(3, dtype=torch.long, device="cuda"),
                  tables=torch.zeros(3, width, dtype=torch.long, device="cuda"))
    out = torch.empty_like(static["q"])

    def load(case, k, v):
        for name, value in (("q", case.q), ("k", k), ("v", v), ("cu", case.cu_seqlens_q),
                            ("seq_lens", case.seq_lens)):
            static[name].copy_(value)
        n = case.k_cache.shape[0]
        static["k_cache"][:n].copy_(case.k_cache)
        static["v_cache"][:n].copy_(case.v_cache)
        static["tables"][:, : case.block_tables.shape[1]].copy_(case.block_tables)

    def step():
        varlen_attention(static["q"], static["k"], static["v"], static["k_cache"], static["v_cache"], static["cu"],
                         static["seq_lens"], static["tables"], out=out)

    load(cases[0], *fresh[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles the kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for case, (k, v) in zip(cases[::-1], fresh[::-1]):
        load(case, k, v)
        graph.replay()
        torch.testing.assert_close(out.float().cpu(), reference_attention(case.cpu()), atol=3e-2, rtol=3e-2)
