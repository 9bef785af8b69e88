"""The small kernels against stage 01/03's PyTorch code: KV write, RMSNorm (+ residual), RoPE."""
import pytest
import torch

from course.s01_decode_loop.model import RMSNorm
from course.s01_decode_loop.rope import apply_rope
from course.s06_kernels_graphs.fused_norm import fused_add_rms_norm, rms_norm
from course.s06_kernels_graphs.kv_write import write_kv
from course.s06_kernels_graphs.rotary import apply_rotary_

TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", list(TOL), ids=lambda d: str(d).split(".")[1])


def close(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


def fused_qkv(t, heads, kv_heads, dim, dtype, seed=0):
    """q, k, v as strided views of one [T, (H + 2 Hkv) * D] buffer, the way fused_model makes them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    q = qkv[:, :heads * dim].view(t, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(t, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(t, kv_heads, dim)
    return qkv, q, k, v


@DTYPES
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("t, kv_heads, dim", [(1, 1, 16), (7, 3, 12), (33, 2, 64)])
def test_write_kv_touches_only_the_mapped_slots(dtype, index_dtype, t, kv_heads, dim):
    _, _, k, v = fused_qkv(t, 4, kv_heads, dim, dtype)  # non-contiguous views
    blocks, block_size = t // 2 + 3, 4
    slots = torch.randperm(blocks * block_size)[:t]
    slots[::3] = -1  # padding rows: skipped
    k_cache = torch.full((blocks, block_size, kv_heads, dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    write_kv(k, v, k_cache, v_cache, slots.to(index_dtype))
    want_k, want_v = k_cache.clone().fill_(float("nan")), v_cache.clone().fill_(float("nan"))
    real = slots >= 0
    want_k.view(-1, kv_heads, dim)[slots[real]] = k[real]  # stage 03's scatter
    want_v.view(-1, kv_heads, dim)[slots[real]] = v[real]
    torch.testing.assert_close(k_cache, want_k, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, want_v, equal_nan=True, atol=0, rtol=0)


@DTYPES
@pytest.mark.parametrize("t, hidden", [(1, 48), (7, 72), (33, 576)])
def test_rms_norm_equals_stage01(dtype, t, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(t, hidden, generator=g).to(dtype)
    norm = RMSNorm(hidden, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=g))
    norm = norm.to(dtype)
    with torch.no_grad():
        close(rms_norm(x, norm.weight, 1e-6), norm(x), dtype)


@DTYPES
@pytest.mark.parametrize("t, hidden", [(1, 48), (7, 72), (33, 576)])
def test_fused_add_rms_norm_returns_the_sum_and_its_norm_and_leaves_inputs(dtype, t, hidden):
    g = torch.Generator().manual_seed(t)
    x, residual = (torch.randn(t, hidden, generator=g).to(dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    x0, r0 = x.clone(), residual.clone()
    normed, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    want_sum = x + residual
    if dtype == torch.float32:
        torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)
    else:  # the interpreter's fp32 -> bf16 cast can land one unit in the last place off torch's rounding
        close(summed, want_sum, dtype)
    norm = RMSNorm(hidden, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        close(normed, norm(want_sum), dtype)
    assert torch.equal(x, x0) and torch.equal(residual, r0)


@DTYPES
@pytest.mark.parametrize("t, heads, kv_heads, dim", [(1, 4, 2, 16), (7, 6, 2, 12), (33, 9, 3, 64), (5, 8, 8, 128)])
def test_rotary_in_place_equals_apply_rope_and_spares_v(dtype, t, heads, kv_heads, dim):
    qkv, q, k, v = fused_qkv(t, heads, kv_heads, dim, dtype, seed=dim)
    positions = torch.randint(0, 500, (t,))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    want_q, want_k, v0 = apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.clone()
    apply_rotary_(q, k, cos, sin)
    close(q, want_q, dtype)
    close(k, want_k, dtype)
    assert torch.equal(v, v0)
