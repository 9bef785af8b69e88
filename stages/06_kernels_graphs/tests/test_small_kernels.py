"""The small kernels against stage 01/03's PyTorch code: KV write, RMSNorm (+ residual), RoPE,
SiLU * up (the gpu room's RoPE folded into the KV write: gpu/tests/test_rotary_kv_write.py).
Pools start as NaN so a stray write shows; q/k/v are strided views of one fused qkv buffer."""
import os

import pytest
import torch
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import RMSNorm
from course.s01_decode_loop.rope import RotaryEmbedding, apply_rope
from course.s03_paged.paged_attention import (
    PagedAttention,
    PagedAttentionMetadata,
    PagedKVCache,
)
from course.s06_kernels_graphs.fused_norm import fused_add_rms_norm, rms_norm
from course.s06_kernels_graphs.kv_write import write_kv
from course.s06_kernels_graphs.rotary import apply_rotary_
from course.s06_kernels_graphs.silu_mul import silu_mul
from course.s06_kernels_graphs.sync_guard import sync_guard

TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", list(TOL), ids=lambda d: str(d).split(".")[1])
# The interpreter rounds fp32 -> bf16 toward zero (a GPU and torch round to nearest even), so a
# bf16 result can sit one unit in the last place off torch's even where the math is identical.
BF16_TRUNCATES = os.environ.get("TRITON_INTERPRET") == "1"


def close(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


def config(heads, kv_heads, dim):
    return ModelConfig(vocab_size=32, hidden_size=heads * dim, intermediate_size=8, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim)


def fused_qkv(t, heads, kv_heads, dim, dtype, seed=0):
    """q, k, v as slices of one [T, H + 2 Hkv, D] buffer, the way fused_model makes them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, heads + 2 * kv_heads, dim, generator=g).to(dtype)
    q, k, v = qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]
    assert q.stride(0) == k.stride(0) == v.stride(0) == (heads + 2 * kv_heads) * dim  # strided rows
    return qkv, q, k, v


# ---- write_kv ---------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("kv_heads, dim, block_size, index_dtype", [(1, 16, 4, torch.int32), (3, 12, 2, torch.int64),
                                                                    (2, 64, 16, torch.int32), (2, 128, 8, torch.int64)])
def test_write_kv_equals_stage03_scatter_on_a_ragged_batch(dtype, index_dtype, kv_heads, dim, block_size):
    cfg = config(2 * kv_heads, kv_heads, dim)
    seqs_shape = [(0, 7), (5, 1), (13, 25)]  # (cached, new): T = 33, with prefill and decode rows
    num_blocks = sum(-(-(c + n) // block_size) for c, n in seqs_shape) + 2
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(dim)).tolist()  # shuffled
    seqs = [(c, n, [ids.pop() for _ in range(-(-(c + n) // block_size))]) for c, n in seqs_shape]
    meta = PagedAttentionMetadata.build(seqs, block_size)
    t = meta.slot_mapping.shape[0]
    _, q, k, v = fused_qkv(t, cfg.num_attention_heads, kv_heads, dim, dtype, seed=dim)
    cache = PagedKVCache(cfg, num_blocks, block_size, dtype=dtype)
    cache.k.fill_(float("nan"))
    cache.v.fill_(float("nan"))
    k_cache, v_cache = cache.k[0].clone(), cache.v[0].clone()
    PagedAttention(cache).forward(0, q, k, v, meta)  # stage 03 writes its pool (attention output unused)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping.to(index_dtype))
    torch.testing.assert_close(k_cache, cache.k[0], equal_nan=True, atol=0, rtol=0)  # bit for bit
    torch.testing.assert_close(v_cache, cache.v[0], equal_nan=True, atol=0, rtol=0)


def head_major(t, heads, dim, dtype, seed=0):
    """[T, heads, D] whose head stride (T * D) is not D: a layout a kernel assuming D would misread."""
    return torch.randn(heads, t, dim, generator=torch.Generator().manual_seed(seed)).to(dtype).transpose(0, 1)


@DTYPES
@pytest.mark.parametrize("layout", ["qkv_slices", "head_major"])
@pytest.mark.parametrize("t, kv_heads, dim, index_dtype", [(1, 1, 16, torch.int32), (7, 3, 12, torch.int64),
                                                           (33, 2, 64, torch.int32)])
def test_write_kv_changes_only_mapped_slots_and_skips_negative_ones(dtype, index_dtype, layout, t, kv_heads, dim):
    if layout == "qkv_slices":
        _, _, k, v = fused_qkv(t, 4, kv_heads, dim, dtype)
    else:
        k, v = head_major(t, kv_heads, dim, dtype, seed=1), head_major(t, kv_heads, dim, dtype, seed=2)
    blocks, block_size = t // 2 + 3, 4
    num_slots = blocks * block_size
    # Never the last slot: a -1 that leaked through as a Python-style index would land there.
    slots = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(t))[:t]
    slots[1::3] = -1  # padding rows (vLLM's convention): skipped
    k_cache = torch.full((blocks, block_size, kv_heads, dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    write_kv(k, v, k_cache, v_cache, slots.to(index_dtype))
    for cache, src in ((k_cache, k), (v_cache, v)):
        flat = cache.view(num_slots, kv_heads, dim)
        for row, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.equal(flat[slot], src[row]), f"token {row} not copied to slot {slot}"
        untouched = torch.ones(num_slots, dtype=torch.bool)
        untouched[slots[slots >= 0]] = False
        assert flat[untouched].isnan().all(), "a slot outside the mapping was written"


def test_write_kv_with_every_slot_negative_writes_nothing():
    _, _, k, v = fused_qkv(5, 2, 2, 16, torch.float32)
    k_cache = torch.full((2, 4, 2, 16), float("nan"))
    v_cache = k_cache.clone()
    write_kv(k, v, k_cache, v_cache, torch.full((5,), -1, dtype=torch.int32))
    assert k_cache.isnan().all() and v_cache.isnan().all()


# ---- rms_norm, fused_add_rms_norm ----------------------------------------------------------------

def stage01_norm(weight, eps):
    norm = RMSNorm(weight.shape[0], eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


def random_rows(t, hidden, dtype, seed, n=1):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(t, hidden, generator=g).to(dtype) for _ in range(n)]
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    return rows, weight


@DTYPES
@pytest.mark.parametrize("t, hidden", [(1, 48), (7, 72), (33, 576)])
def test_rms_norm_equals_stage01_rmsnorm(dtype, t, hidden):
    (x,), weight = random_rows(t, hidden, dtype, seed=hidden)
    got = rms_norm(x, weight, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    with torch.no_grad():
        close(got, stage01_norm(weight, 1e-6)(x), dtype)


def test_rms_norm_reads_strided_rows_and_fills_the_given_out():
    (wide,), weight = random_rows(7, 100, torch.float32, seed=1)
    x = wide[:, 10:82]  # hidden 72, row stride 100
    out = torch.full((7, 72), float("nan"))
    assert rms_norm(x, weight[:72].contiguous(), 1e-5, out=out) is out
    with torch.no_grad():
        close(out, stage01_norm(weight[:72], 1e-5)(x), torch.float32)


@DTYPES
@pytest.mark.parametrize("t, hidden", [(1, 48), (7, 72), (33, 576)])
def test_fused_add_rms_norm_returns_the_sum_and_its_norm_and_leaves_inputs(dtype, t, hidden):
    (x, residual), weight = random_rows(t, hidden, dtype, seed=t, n=2)
    x0, r0 = x.clone(), residual.clone()
    normed, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    want_sum = x + residual
    if dtype == torch.bfloat16 and BF16_TRUNCATES:
        close(summed, want_sum, dtype)
    else:  # fp32 add, one rounding to x's dtype: torch's add, bit for bit
        torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)
    with torch.no_grad():
        close(normed, stage01_norm(weight, 1e-5)(want_sum), dtype)
    assert torch.equal(x, x0) and torch.equal(residual, r0)  # out of place


# ---- apply_rotary_ -------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("t, heads, kv_heads, dim", [(1, 4, 2, 16), (7, 6, 2, 12), (33, 9, 3, 64), (5, 8, 8, 128)])
def test_rotary_in_place_on_qkv_views_equals_apply_rope_and_spares_v(dtype, t, heads, kv_heads, dim):
    _, q, k, v = fused_qkv(t, heads, kv_heads, dim, dtype, seed=dim)
    positions = torch.randint(0, 500, (t,), generator=torch.Generator().manual_seed(t))
    cos, sin = RotaryEmbedding(config(heads, kv_heads, dim))(positions)  # stage 01's [T, D/2] fp32
    want_q, want_k, v0 = apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.clone()
    apply_rotary_(q, k, cos, sin)
    close(q, want_q, dtype)
    close(k, want_k, dtype)
    assert torch.equal(v, v0)


@pytest.mark.parametrize("t, heads, kv_heads, dim", [(1, 2, 1, 16), (7, 6, 3, 12)])
def test_rotary_follows_any_head_and_channel_strides(t, heads, kv_heads, dim):
    q = head_major(t, heads, dim, torch.float32, seed=1)
    k = torch.randn(t, dim, kv_heads, generator=torch.Generator().manual_seed(2)).transpose(1, 2)  # channel stride Hkv
    angles = torch.rand(t, dim // 2) * 6.3
    cos, sin = angles.cos(), angles.sin()
    want_q, want_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    apply_rotary_(q, k, cos, sin)
    close(q, want_q, torch.float32)
    close(k, want_k, torch.float32)


# ---- silu_mul -----------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("t, inner", [(1, 8), (7, 36), (3, 1536), (33, 2400)])
def test_silu_mul_equals_torch_silu_times_up(dtype, t, inner):
    wide = torch.randn(t, 2 * inner + 5, generator=torch.Generator().manual_seed(inner)).mul(3).to(dtype)
    gate_up = wide[:, : 2 * inner]  # strided rows, as a sliced matmul output would be
    gate, up = gate_up.chunk(2, dim=-1)
    got = silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (t, inner)
    close(got, torch.nn.functional.silu(gate) * up, dtype)


# ---- all of them, as a CUDA graph would run them ----------------------------------------------

def test_small_kernels_never_read_tensor_values_on_the_host():
    _, q, k, v = fused_qkv(3, 4, 2, 16, torch.float32)
    k_cache = torch.full((2, 4, 2, 16), float("nan"))
    v_cache = k_cache.clone()
    cos, sin = torch.rand(3, 8), torch.rand(3, 8)
    (x, residual), weight = random_rows(3, 48, torch.float32, seed=0, n=2)
    slots = torch.tensor([5, -1, 0])
    with sync_guard():  # raises on .item(), .tolist(), boolean masks, ...
        write_kv(k, v, k_cache, v_cache, slots)
        apply_rotary_(q, k, cos, sin)
        silu_mul(x)
        rms_norm(x, weight, 1e-5)
        fused_add_rms_norm(x, residual, weight, 1e-5)
    assert not k_cache[1, 1].isnan().any() and not k_cache[0, 0].isnan().any()
