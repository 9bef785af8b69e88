"""A quantized pool (int8 or fp8 codes of rotated rows, a scale byte per token and KV head): each
value within one rounding step, the scale byte and the rotation exact, attention equal to
attention over the K/V the pool gives back, and prefix caching, block copies and the byte
accounting unchanged in kind."""
import pytest
import torch

from course.s01_decode_loop.attention import causal_attention
from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.engine import PagedGenerator
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course.s03_paged.quantized_kv import (QMAX, dequantize, load_rows, pool_bytes_per_token, quantize, rotate,
                                           scale_byte, scale_value, storage_dtype, store_rows)
from course.s02_kv_cache.kv_size import LLAMA3_70B

CODES = [torch.int8, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", CODES)
def test_every_value_comes_back_within_one_rounding_step(dtype):
    x = torch.randn(64, 3, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)[:, None, None]
    codes, scales = quantize(x, dtype)
    back = dequantize(codes, scales)
    scale = scale_value(scales)[..., None]
    if dtype == torch.int8:  # a uniform grid: half a step
        bound = scale / 2
    else:  # three mantissa bits: 1/16 of the value, or half a subnormal step (2^-9 of the scale's 448)
        bound = torch.maximum(x.abs() / 16, scale * 2.0 ** -10)
    assert ((back - x).abs() <= bound * 1.001 + 1e-12).all()
    assert (codes.float().abs() <= QMAX[dtype]).all() and scales.dtype == torch.uint8


def test_a_scale_byte_is_the_smallest_that_covers_the_ratio():
    every = torch.arange(256, dtype=torch.uint8)
    values = scale_value(every)
    assert values[0] == 2.0 ** -12 and values[255] == 15.5 and (values[1:] > values[:-1]).all()
    assert torch.equal(scale_byte(values), every)  # a value that is a scale keeps its byte
    ratio = torch.rand(10_000, generator=torch.Generator().manual_seed(0)) * 16
    byte = scale_byte(ratio)
    inside = byte < 255
    assert (scale_value(byte)[inside] >= ratio[inside]).all()  # rounded up: no code is clipped
    below = byte.int() - 1
    assert (scale_value(below.clamp(min=0).to(torch.uint8))[below >= 0] < ratio[below >= 0]).all()
    up = byte > 0  # byte 0: every ratio below 2^-12
    assert (scale_value(byte)[up] <= ratio[up] * 17 / 16).all()  # at most one step of 1/16 up


@pytest.mark.parametrize("dim", [64, 128, 80])
def test_rotation_is_an_orthonormal_walsh_hadamard_matrix_and_its_own_inverse(dim):
    block = dim & -dim  # 80: blocks of 16
    hadamard = torch.ones(1, 1)
    while len(hadamard) < block:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)])
    matrix = torch.block_diag(*[hadamard / block ** 0.5] * (dim // block))
    x = torch.randn(7, dim, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rotate(x), x @ matrix)
    torch.testing.assert_close(rotate(rotate(x)), x)
    torch.testing.assert_close(rotate(x).norm(dim=-1), x.norm(dim=-1))


def test_rotating_a_row_with_outlier_channels_shrinks_its_int8_error():
    """A key row's few large channels set its one scale; rotated, its values are alike in size."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(256, 64, generator=g)
    x[:, :4] *= 30  # four outlier channels, as RoPE's low-frequency pairs make in keys
    plain = (dequantize(*quantize(x, torch.int8)) - x).pow(2).mean()
    rotated = (load_rows(*store_rows(x, torch.int8)) - x).pow(2).mean()
    assert rotated < plain / 4


def test_a_row_of_zeros_stays_zero_without_nan():
    codes, scales = quantize(torch.zeros(2, 8), torch.int8)
    assert torch.equal(dequantize(codes, scales), torch.zeros(2, 8))


@pytest.mark.parametrize("config, ratio", [(tiny_model("gqa_tied").config, None), (LLAMA3_70B, 3.96)])
def test_int8_pool_holds_about_four_times_the_tokens_of_float32(config, ratio):
    """head_dim values of one byte and a scale byte against 4 bytes each: 4 d / (d + 1)."""
    d = config.head_dim
    got = pool_bytes_per_token(config, torch.float32) / pool_bytes_per_token(config, torch.int8)
    assert got == pytest.approx(4 * d / (d + 1), rel=1e-3) and got > (ratio or 0)
    assert pool_bytes_per_token(config, torch.bfloat16) * 2 == pool_bytes_per_token(config, torch.float32)
    if ratio is None:  # the pool allocates exactly what the accounting says
        assert PagedKVCache(config, 4, 16, kv_dtype=torch.int8).nbytes == 4 * 16 * pool_bytes_per_token(config, torch.int8)


def test_unknown_kv_cache_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="int8, fp8"):
        storage_dtype("int4", torch.float32)
    assert storage_dtype("auto", torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("dtype", CODES + [torch.bfloat16])
def test_paged_attention_over_a_stored_pool_is_attention_over_the_dequantized_kv(dtype):
    model = tiny_model("gqa_tied")
    c = model.config
    cache = PagedKVCache(c, num_blocks=8, block_size=4, kv_dtype=dtype)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(11, c.num_attention_heads, c.head_dim, generator=g)
    k, v = (torch.randn(11, c.num_key_value_heads, c.head_dim, generator=g) for _ in range(2))
    meta = PagedAttentionMetadata.build([(0, 11, [5, 2, 7])], block_size=4)
    got = PagedAttention(cache).forward(0, q, k, v, meta)
    k_back, v_back = (load_rows(*store_rows(x, dtype)) for x in (k, v))
    torch.testing.assert_close(got, causal_attention(q, k_back, v_back, q_start=0))
    assert not torch.equal(k_back, k)  # the pool kept codes, not the values


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_a_prefix_hit_reads_the_codes_a_recompute_writes(byte_tok, kv_cache_dtype):
    """The scale comes from the token's own row: a cached block holds what computing it again
    would write, so greedy tokens are the same with prefix caching on and off."""
    model = tiny_model("gqa_tied")
    prompt = list(b"a shared prefix of some length, then ") + list(b"more")
    greedy = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    outs = []
    for caching in (True, False):
        gen = PagedGenerator(model, num_blocks=32, block_size=4, enable_prefix_caching=caching,
                             kv_cache_dtype=kv_cache_dtype)
        for _ in range(2):  # the second run hits the first's blocks (when caching)
            outs.append(run_to_end(gen, model, byte_tok, prompt, greedy).token_ids)
        if caching:
            assert gen.stats()["prefix_hit_tokens"] > 0
    assert outs[0] == outs[1] == outs[2] == outs[3]


def test_copy_blocks_copies_the_scales_with_the_codes():
    cache = PagedKVCache(tiny_model("gqa_tied").config, num_blocks=3, block_size=2, kv_dtype=torch.int8)
    cache.k_scale[:, 0] = 2
    cache.k[:, 0] = 5
    cache.copy_blocks([(0, 2)])
    assert (cache.k_scale[:, 2] == 2).all() and (cache.k[:, 2] == 5).all()
