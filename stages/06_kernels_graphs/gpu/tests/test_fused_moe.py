"""The fused MoE kernel (gpu/fused_moe.py) and its PyTorch twin of the same layout compute what
stage 01's loop computes: under the interpreter here, compiled on a GPU (marked `gpu`)."""
import pytest
import torch

from course.s01_decode_loop.moe.experts import Experts, naive_experts
from course.s01_decode_loop.moe.router import route
from course.s06_kernels_graphs.gpu.fused_moe import align_pairs, blocked_experts, fused_moe
from course.s06_kernels_graphs.sync_guard import sync_guard


def case(rows, num_experts, top_k, hidden, inter, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    experts = Experts(num_experts, hidden, inter)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    x = torch.randn(rows, hidden, generator=g)
    weights, ids = route(torch.randn(rows, num_experts, generator=g), top_k, renormalize=True)
    return experts.to(device, dtype), x.to(device, dtype), weights.to(device, dtype), ids.to(device)


def test_moe_align_pairs_layout():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])  # pairs 0..5 -> experts 2 0 2 3 0 2
    sorted_pairs, block_experts, padded_len = align_pairs(ids, num_experts=4, block_m=4)
    used = int(padded_len)
    assert used == 12  # expert 0: 2 pairs, 2: 3, 3: 1, each padded to one block of 4
    assert sorted_pairs[:used].tolist() == [1, 4, 6, 6, 0, 2, 5, 6, 3, 6, 6, 6]  # 6 = padding
    assert block_experts[:3].tolist() == [0, 2, 3]


@pytest.mark.parametrize("rows,num_experts,top_k,hidden,inter", [
    (1, 8, 2, 48, 40), (3, 8, 3, 48, 40), (17, 6, 2, 40, 24), (64, 8, 2, 48, 40), (5, 16, 8, 32, 20)])
def test_moe_fused_kernel_interpreted_equals_naive_loop(rows, num_experts, top_k, hidden, inter):
    experts, x, weights, ids = case(rows, num_experts, top_k, hidden, inter)
    with torch.no_grad():
        ref = naive_experts(experts, x, weights, ids)
        torch.testing.assert_close(fused_moe(experts, x, weights, ids), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(blocked_experts(experts, x, weights, ids), ref, atol=1e-5, rtol=1e-5)


def test_moe_blocked_and_fused_paths_are_graph_safe():
    experts, x, weights, ids = case(9, 8, 2, 32, 24)
    with torch.no_grad(), sync_guard():
        blocked_experts(experts, x, weights, ids)
        fused_moe(experts, x, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 200])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_moe_compiled_fused_kernel_equals_naive_loop(rows, dtype, tol):
    experts, x, weights, ids = case(rows, 128, 8, 256, 96, device="cuda", dtype=dtype)
    with torch.no_grad():
        out = fused_moe(experts, x, weights, ids).float().cpu()
        ref = naive_experts(experts.float().cpu(), x.float().cpu(), weights.float().cpu(), ids.cpu())
    assert (out - ref).abs().max() <= tol * ref.abs().max()  # bf16: ~3 significant digits per product

