"""ops.c against fused_model.py's TorchOps (the reference for every ops set)."""
import pytest
import torch

from course.s06_kernels_graphs.cpu.ops import CpuOps
from course.s06_kernels_graphs.fused_model import TorchOps


@pytest.mark.parametrize("tokens", [1, 7, 40])  # 40: past the rows where the C loops go parallel
@pytest.mark.parametrize("dim", [48, 576])
def test_norms_match_torch(tokens, dim):
    g = torch.Generator().manual_seed(tokens + dim)
    x, residual = torch.randn(tokens, dim, generator=g), torch.randn(tokens, dim, generator=g)
    weight = torch.randn(dim, generator=g)
    torch.testing.assert_close(CpuOps.rms_norm(x, weight, 1e-5), TorchOps.rms_norm(x, weight, 1e-5))
    (got, got_sum), (want, want_sum) = (ops.add_rms_norm(x, residual, weight, 1e-5) for ops in (CpuOps, TorchOps))
    assert torch.equal(got_sum, want_sum)  # the residual stream is an exact add
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("tokens, heads, kv_heads, dim", [(1, 9, 3, 64), (40, 4, 4, 8), (5, 6, 2, 12)])
def test_rotary_in_place_on_views_of_the_qkv_output_matches_torch(tokens, heads, kv_heads, dim):
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g)
    cos, sin = torch.randn(tokens, dim // 2, generator=g), torch.randn(tokens, dim // 2, generator=g)
    results = []
    for ops in (CpuOps, TorchOps):
        buf = qkv.clone()
        q = buf[:, :heads * dim].view(tokens, heads, dim)
        k = buf[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
        ops.rotary_(q, k, cos, sin)
        results.append(buf)
    assert torch.equal(results[0], results[1])  # no sums: the same roundings (no FMA contraction)
    assert not torch.equal(results[0], qkv)  # ... and it did rotate, v untouched
    assert torch.equal(results[0][:, (heads + kv_heads) * dim:], qkv[:, (heads + kv_heads) * dim:])


@pytest.mark.parametrize("tokens", [1, 40])
def test_silu_mul_matches_torch(tokens):
    gate_up = torch.randn(tokens, 2 * 96, generator=torch.Generator().manual_seed(1)) * 4
    torch.testing.assert_close(CpuOps.silu_mul(gate_up), TorchOps.silu_mul(gate_up))


def test_other_dtypes_are_refused():
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        CpuOps.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-5)
