"""RoPE folded into the KV write (gpu/rotary_kv_write.py) leaves, bit for bit, what the lesson's
two kernels leave (rotary.py's in-place RoPE, then kv_write.py's scatter), reads no value on the
host, and touches no slot outside the mapping (the pool starts as NaN)."""
import pytest
import torch

from course.s01_decode_loop.rope import apply_rope
from course.s06_kernels_graphs.gpu.rotary_kv_write import apply_rotary_and_write_kv
from course.s06_kernels_graphs.kv_write import write_kv
from course.s06_kernels_graphs.rotary import apply_rotary_
from course.s06_kernels_graphs.sync_guard import sync_guard

TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def fused_qkv(t, heads, kv_heads, dim, dtype, seed=0):
    """q, k, v as strided slices of one [T, H + 2 Hkv, D] buffer, the way fused_model makes them."""
    qkv = torch.randn(t, heads + 2 * kv_heads, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return qkv, qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]


@pytest.mark.parametrize("dtype", list(TOL), ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("t, heads, kv_heads, dim, index_dtype", [(1, 4, 2, 16, torch.int32), (7, 6, 2, 12, torch.int64),
                                                                  (33, 9, 3, 64, torch.int32), (5, 8, 8, 128, torch.int64)])
def test_rotary_and_kv_write_in_one_launch_equals_the_two_kernels(dtype, index_dtype, t, heads, kv_heads, dim):
    """q and k rotated as apply_rope rotates them; the rotated k and v at the mapped slots, bit for
    bit what apply_rotary_ then write_kv leave; every other slot of the NaN pool untouched."""
    qkv, q, k, v = fused_qkv(t, heads, kv_heads, dim, dtype, seed=dim)
    angles = torch.rand(t, dim // 2, generator=torch.Generator().manual_seed(t)) * 6.3
    cos, sin = angles.cos(), angles.sin()
    want_q, want_k, v0 = apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.clone()
    blocks, block_size = t // 2 + 3, 4
    num_slots = blocks * block_size
    slots = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(t))[:t]  # never the last
    slots[1::3] = -1  # padding rows: rotated, not stored
    pools = [torch.full((blocks, block_size, kv_heads, dim), float("nan"), dtype=dtype) for _ in range(4)]
    qkv_two = qkv.clone()
    q2, k2, v2 = qkv_two[:, :heads], qkv_two[:, heads:heads + kv_heads], qkv_two[:, heads + kv_heads:]
    apply_rotary_(q2, k2, cos, sin)  # the lesson's two kernels
    write_kv(k2, v2, pools[2], pools[3], slots.to(index_dtype))
    apply_rotary_and_write_kv(q, k, v, cos, sin, pools[0], pools[1], slots.to(index_dtype))
    torch.testing.assert_close(q.float(), want_q.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(k.float(), want_k.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(v, v0) and torch.equal(qkv, qkv_two)
    for got, want in ((pools[0], pools[2]), (pools[1], pools[3])):
        torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    for pool, src in ((pools[0], k), (pools[1], v)):
        flat = pool.view(num_slots, kv_heads, dim)
        assert flat[untouched].isnan().all(), "a slot outside the mapping was written"
        assert torch.equal(flat[slots[slots >= 0]], src[slots >= 0])


def test_the_fold_never_reads_tensor_values_on_the_host():
    _, q, k, v = fused_qkv(3, 4, 2, 16, torch.float32)
    k_cache = torch.full((2, 4, 2, 16), float("nan"))
    v_cache = k_cache.clone()
    cos, sin, slots = torch.rand(3, 8), torch.rand(3, 8), torch.tensor([5, -1, 0])
    with sync_guard():  # raises on .item(), .tolist(), boolean masks, ...
        apply_rotary_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    assert not k_cache[1, 1].isnan().any() and not k_cache[0, 0].isnan().any() and k_cache[0, 1].isnan().all()
