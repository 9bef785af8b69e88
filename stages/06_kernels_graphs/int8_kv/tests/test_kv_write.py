"""The int8_kv room's KV write against stage 03's torch write, under Triton's interpreter on CPU."""
import pytest
import torch

from course.s01_decode_loop.config import ModelConfig
from course.s03_paged.paged_attention import PagedAttentionMetadata, PagedKVCache
from course.s03_paged.quantized_kv import rotate
from course.s06_kernels_graphs.int8_kv.kv_write import write_int8_kv


def config(heads, kv_heads, dim):
    return ModelConfig(vocab_size=32, hidden_size=heads * dim, intermediate_size=8, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim)


def fused_qkv(t, heads, kv_heads, dim, dtype, seed=0):
    """q, k, v as slices of one [T, H + 2 Hkv, D] buffer, the way fused_model makes them."""
    qkv = torch.randn(t, heads + 2 * kv_heads, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return qkv, qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kv_heads, dim, block_size", [(1, 16, 4), (3, 12, 2), (3, 64, 16)])
def test_write_kv_into_a_stored_int8_pool_stores_what_stage03_quantize_stores(dtype, kv_heads, dim, block_size):
    """Codes and scale bytes bit for bit as stage 03's torch write makes them (the row rotated in
    the same order, the scale from its largest value, an exact division, ties rounded to even);
    negative slots skipped."""
    cfg = config(2 * kv_heads, kv_heads, dim)
    meta = PagedAttentionMetadata.build([(0, 7, [3, 0, 5, 1]), (5, 1, [2, 4, 6])], block_size)
    t = meta.slot_mapping.shape[0]
    _, q, k, v = fused_qkv(t, cfg.num_attention_heads, kv_heads, dim, dtype, seed=dim)
    ties = torch.zeros(dim)
    ties[:4] = torch.tensor([0.5, -1.5, 2.5, 127.0])  # rotated back exactly: x / scale lands on .5 (scale 1)
    k[2, 0] = rotate(ties).to(dtype)
    cache = PagedKVCache(cfg, 8, block_size, dtype=dtype, kv_dtype=torch.int8)
    cache.write(0, meta.slot_mapping, k, v)  # stage 03's torch write
    codes = [torch.zeros_like(cache.k[0]) for _ in range(2)]
    scales = [torch.full_like(cache.k_scale[0], 77) for _ in range(2)]
    slots = meta.slot_mapping.clone()
    slots[-1] = -1  # a padding row
    write_int8_kv(k, v, codes[0], codes[1], slots, scales[0], scales[1])
    flat = lambda x: x.flatten(0, 1)  # noqa: E731
    written = slots[slots >= 0]
    for got, want in ((codes[0], cache.k[0]), (codes[1], cache.v[0]), (scales[0], cache.k_scale[0]),
                      (scales[1], cache.v_scale[0])):
        assert torch.equal(flat(got)[written], flat(want)[written])
    assert (flat(scales[0])[meta.slot_mapping[-1]] == 77).all()  # the padding row's slot untouched
    if dtype == torch.float32:  # the tie row came through the rotation as written
        assert torch.equal(rotate(k[2, 0].float()), ties)
