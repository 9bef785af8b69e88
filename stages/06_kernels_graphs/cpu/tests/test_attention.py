"""attention.c against the oracle (stage 03's gather + stage 01's causal attention), the
CPU backend against the torch backend, and what happens where no C compiler is."""
import pytest
import torch

from course.s06_kernels_graphs.cpu import native
from course.s06_kernels_graphs.torch_backend import TorchPagedBackend
from course.s06_kernels_graphs.cpu.backend import CpuPagedBackend
from course.s06_kernels_graphs.cpu.attention import check_shapes, kernel_unavailable, paged_attention_rows
from course.s06_kernels_graphs.bench.testing import (kernel_rows, make_paged_case, one_layer_step,
    reference_attention, stored_case)


@pytest.mark.parametrize("seq_lens, query_lens", [
    ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),  # decodes beside chunks, one after a cached prefix
    ([9, 31, 4, 18, 60], [1, 1, 1, 1, 1]),   # decode only
    ([40, 3], [40, 3]),                      # prefill only
])
# head_dim: multiples of 16 take the vector path (128: scores only), others the plain loops;
# block_size 32: two 16-key score groups per block
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(6, 2, 16), (4, 4, 8), (3, 1, 12), (16, 1, 64), (4, 2, 128)])
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_kernel_equals_the_oracle(seq_lens, query_lens, heads, kv_heads, head_dim, block_size):
    """The pool is NaN outside the sequences' tokens (and the tables' padding points at a NaN
    block): one read past a row's length would poison its output."""
    case = make_paged_case(seq_lens, query_lens, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                           block_size=block_size, seed=heads + block_size)
    rows, seqs, lens = kernel_rows(case)
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, case.block_tables.long(), rows, seqs, lens)
    torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(6, 2, 16), (3, 1, 12), (9, 3, 64), (4, 2, 128)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_kernel_reads_a_stored_pool_as_the_oracle_reads_it_dequantized(dtype, heads, kv_heads, head_dim, block_size):
    """bfloat16 values, or int8/fp8 codes with a scale per (token, KV head), read where they lie:
    what the oracle computes from the same pool dequantized first (stage 03's reference)."""
    case = make_paged_case([7, 33, 1, 50], [1, 5, 1, 16], num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                           block_size=block_size, seed=block_size)
    k_pool, v_pool, dequantized = stored_case(case, dtype)
    rows, seqs, lens = kernel_rows(case)
    got = paged_attention_rows(case.q, k_pool, v_pool, case.block_tables.long(), rows, seqs, lens)
    torch.testing.assert_close(got, reference_attention(dequantized), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_the_portable_c_without_avx512_equals_the_oracle(head_dim, dtype, monkeypatch):
    """Machines without AVX-512 compile the plain loops (and, for stored pools, AVX2's 8-wide
    dequantization) for every head size: same results."""
    import ctypes

    from course.s06_kernels_graphs.cpu import attention as cpu_attention
    fn = native.load(cpu_attention.SOURCE, cpu_attention.FLAGS + ["-mno-avx512f"]).paged_attention_rows_f32
    fn.argtypes, fn.restype = cpu_attention._library().argtypes, ctypes.c_int64
    monkeypatch.setattr(cpu_attention, "_library", lambda: fn)
    case = make_paged_case([7, 33, 50], [1, 5, 1], num_heads=6, num_kv_heads=2, head_dim=head_dim, block_size=16)
    k_pool, v_pool = case.k_cache, case.v_cache
    if dtype != torch.float32:
        k_pool, v_pool, case = stored_case(case, dtype)
    rows, seqs, lens = kernel_rows(case)
    got = paged_attention_rows(case.q, k_pool, v_pool, case.block_tables.long(), rows, seqs, lens)
    torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_kernel_reads_strided_queries_and_leaves_unnamed_rows_alone():
    """q as the fused model hands it over (a view into the merged QKV output); rows not named
    keep what `out` held."""
    case = make_paged_case([12, 30], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4)
    qkv = torch.cat([case.q.flatten(1), torch.randn(2, 32)], dim=1)  # [T, q | k | v]
    q = qkv[:, :32].view(2, 4, 8)
    assert not q.is_contiguous()
    out = torch.full_like(case.q, 5.0)
    one = torch.tensor([1])
    paged_attention_rows(q, case.k_cache, case.v_cache, case.block_tables.long(), one, one, torch.tensor([30]), out)
    torch.testing.assert_close(out[1], reference_attention(case)[1], atol=1e-5, rtol=1e-5)
    assert torch.all(out[0] == 5.0)


def test_bad_tables_raise_instead_of_reading_out_of_bounds():
    case = make_paged_case([12, 30], [1, 1], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
    tables, two = case.block_tables.long(), torch.arange(2)
    with pytest.raises(RuntimeError, match="1 rows had a block table"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, two, two, torch.tensor([12, 300]))
    bad = tables.clone()
    bad[0, 0] = case.k_cache.shape[0]  # one past the pool
    with pytest.raises(RuntimeError, match="outside the pool"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, bad, two, two, case.seq_lens.long())


def test_shapes_the_kernel_does_not_take_are_refused():
    with pytest.raises(ValueError, match="reads pools of float32, bfloat16, int8, float8_e4m3fn on the CPU"):
        check_shapes(torch.zeros(4, 16, 2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="head_dim"):
        check_shapes(torch.zeros(4, 16, 2, 512))
    with pytest.raises(ValueError, match="query heads per KV head"):
        check_shapes(torch.zeros(4, 16, 1, 8), query_heads=32)


@pytest.mark.parametrize("host", [True, False])  # lengths from the runner (a plan), or none (found on the device)
def test_cpu_backend_equals_the_torch_backend(host):
    case = make_paged_case([7, 33, 1, 50, 16, 90], [1, 5, 1, 1, 16, 40], num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=4, seed=3)
    outputs = []
    for make in (CpuPagedBackend, TorchPagedBackend):
        backend, meta, (k_new, v_new) = one_layer_step(case, make, host)
        if backend.name == "cpu" and host:  # every row, each seeing its sequence up to its own position
            assert meta.plan.rows.tolist() == list(range(sum(case.query_lens)))
            assert meta.plan.lens.tolist()[1:6] == [29, 30, 31, 32, 33]  # the 5-token chunk of 33
        outputs.append(backend.forward(0, case.q, k_new, v_new, meta))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[0], reference_attention(case), atol=1e-5, rtol=1e-5)


def test_without_a_compiler_the_backend_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("COURSE_KERNEL_CACHE", str(tmp_path / "cache"))  # empty: nothing compiled to reuse
    native.forget_loaded()
    try:
        reason = kernel_unavailable()
        assert reason and "no C compiler" in reason
        case = make_paged_case([5], [1], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
        with pytest.raises(ValueError, match="needs its C kernel"):
            one_layer_step(case, CpuPagedBackend)
    finally:
        monkeypatch.undo()
        native.forget_loaded()
    assert kernel_unavailable() is None


def test_loading_the_kernels_leaves_float_subnormals_alone():
    """attention.c is compiled with -ffast-math; linked with it, gcc's crtfastmath.o would
    switch the whole process to flush-to-zero on load (torch's float math included)."""
    from course.s06_kernels_graphs.cpu.ops import ops_unavailable

    assert kernel_unavailable() is None and ops_unavailable() is None
    tiny = torch.tensor(1e-38, dtype=torch.float32)
    assert (tiny / 100).item() != 0.0


def test_course_cpu_arch_builds_the_kernels_for_another_target():
    """`COURSE_CPU_ARCH=haswell` (AVX2 + FMA) builds what a Zen 3 host would, on any x86 machine,
    so its path can be measured here; the default is this machine's own."""
    import os
    import subprocess
    import sys

    show = "from course.s06_kernels_graphs.cpu import native; print(' '.join(native.BASE_FLAGS))"
    for arch, flag in [("haswell", "-march=haswell"), ("", "-march=native")]:
        env = {**os.environ, "COURSE_CPU_ARCH": arch}
        out = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True).stdout
        assert flag in out.split()


def random_tree_mask(n: int, seed: int) -> torch.Tensor:
    """[n, n] for a random tree over a block [root, nodes...]: row i sees its ancestors and itself."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    return mask


@pytest.mark.parametrize("n, block_size", [(6, 4), (17, 16), (64, 32), (9, 1)])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_tree_rows_see_the_prefix_and_their_own_path(n, block_size, head_dim):
    """A speculative tree's rows (the last n of a sequence, beside a plain decode): each sees the
    cached prefix and, of the tree's keys, its ancestors and itself, as a masked softmax over the
    gathered keys does (tree_attention_sdpa, the torch backend's)."""
    from course.s06_kernels_graphs.cpu.backend import tree_bits
    from course.s06_kernels_graphs.cpu.planned import tree_attention_sdpa

    case = make_paged_case([70, 40 + n], [1, n], num_heads=6, num_kv_heads=2, head_dim=head_dim,
                           block_size=block_size, seed=n)
    mask = random_tree_mask(n, seed=n)
    rows, seqs, lens = kernel_rows(case)
    first = lens.clone()
    first[1:] = 40  # the tree's rows: its block starts at position 40
    bits = torch.tensor([0] + tree_bits(mask), dtype=torch.long)
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, case.block_tables.long(), rows, seqs, lens,
                               tree_first=first, tree_bits=bits)
    torch.testing.assert_close(got[:1], reference_attention(case)[:1], atol=1e-5, rtol=1e-5)
    blocks = case.block_tables[1, : -(-(40 + n) // block_size)].long()
    k, v = (pool[blocks].flatten(0, 1)[:40 + n] for pool in (case.k_cache, case.v_cache))
    torch.testing.assert_close(got[1:], tree_attention_sdpa(case.q[1:], k, v, mask), atol=1e-5, rtol=1e-5)
    if n > 2:  # the mask matters: a plain causal chunk differs
        assert not torch.allclose(got[1:], reference_attention(case)[1:], atol=1e-3)


@pytest.mark.parametrize("dim", [12, 16, 64, 80, 128, 256])
def test_the_c_rotation_gives_torchs_bits(dim):
    """attention.c's rotate_row (its in-vector rounds on AVX-512 and AVX2, the plain loop elsewhere)
    equals stage 03's quantized_kv.rotate bit for bit: a quantized pool's codes and scales come out
    the same whichever path wrote them."""
    import ctypes

    from course.s03_paged.quantized_kv import rotate
    from course.s06_kernels_graphs.cpu import attention

    lib = native.load(attention.SOURCE, attention.FLAGS)
    lib.rotate_rows_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    x = torch.randn(9, dim, generator=torch.Generator().manual_seed(dim)) * torch.logspace(-2, 2, 9)[:, None]
    got = x.clone()
    lib.rotate_rows_f32(got.data_ptr(), 9, dim)
    assert torch.equal(got, rotate(x))
