"""The cpu backend's MoE experts: stage 04's grouped path through layer.c's products."""
import pytest
import torch

from course.s01_decode_loop.moe.experts import Experts, naive_experts
from course.s01_decode_loop.moe.router import route
from course.s06_kernels_graphs import cpu

cpu.register()  # the room's backend and engine options, as the CLI plugs them in


def case(rows, num_experts, top_k, hidden, inter, seed=0):
    g = torch.Generator().manual_seed(seed)
    experts = Experts(num_experts, hidden, inter)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    weights, ids = route(torch.randn(rows, num_experts, generator=g), top_k, renormalize=True)
    return experts, torch.randn(rows, hidden, generator=g), weights, ids


def test_moe_cpu_backend_experts_through_the_c_products_equal_the_loop():
    from course.s01_decode_loop.testing import TINY_CONFIGS
    from course.s03_paged.paged_attention import PagedKVCache
    from course.s06_kernels_graphs.cpu.layer import layer_kernel_unavailable
    from course.s06_kernels_graphs.engine import make_backend

    if layer_kernel_unavailable():
        pytest.skip(layer_kernel_unavailable())
    backend = make_backend("cpu", PagedKVCache(TINY_CONFIGS["gqa_tied"], 4, 4))
    for rows in (1, 3, 17, 64, 100):
        experts, x, weights, ids = case(rows, 8, 2, 48, 40, seed=rows)
        with torch.no_grad():
            torch.testing.assert_close(backend.experts_kernel(experts, x, weights, ids),
                                       naive_experts(experts, x, weights, ids), atol=1e-5, rtol=1e-5)


def test_moe_cpu_benchmark_runs_at_tiny_shapes(tmp_path):
    from course.s06_kernels_graphs.cpu.bench_moe_cpu import main
    from course.s06_kernels_graphs.cpu.layer import layer_kernel_unavailable

    if layer_kernel_unavailable():
        pytest.skip(layer_kernel_unavailable())
    result = main(["--experts", "8", "--hidden", "64", "--inter", "32", "--top-k", "2", "--batches", "1", "5",
                   "--reps", "1", "--json", str(tmp_path / "moe.json")])
    assert [r["distinct_experts"] for r in result["rows"]][0] == 2
    assert all(r["products_ms"] > 0 and r["grouped_ms"] > 0 for r in result["rows"])
