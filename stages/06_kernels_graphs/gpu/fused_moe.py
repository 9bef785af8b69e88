"""A Mixture-of-Experts layer's experts as two grouped GEMM launches (the idea of vLLM's
`fused_moe`, vllm/model_executor/layers/fused_moe/fused_moe.py; this is our own, smaller one).

Stage 04's grouped path (moe/grouped.py) runs one product per chosen expert: a Python loop,
its shapes read back to the host, 2 launches per expert. Here the step's (token, expert)
pairs are laid out once, on the device, so that ONE launch multiplies every pair with its
expert's weights:

    pairs sorted by expert, each expert's run padded to BLOCK_M rows (padding = a sentinel):
        sorted_pairs   [ 5  9  2  -  | 0  7  -  -  | 3  1  8  4 | ... ]
        block_experts  [     e0      |     e2      |     e3     | ... ]   one expert per block

    program (block m, tile n): rows = x[token of each pair of block m], W = weights of
    block_experts[m]; acc = rows @ W[:, n-tile]; skip the sentinels; store each row at its pair

The first launch computes gate_up = x @ W13[e] for every pair, silu(gate) * up follows
(silu_mul.py's kernel), the second computes down = act @ W2[e] and multiplies each row by its
routing weight in the epilogue, before the store; each token's k rows are then summed. Every
program streams one expert's weight tile once for up to BLOCK_M rows: at decode (a few pairs
per expert) the launches read just the chosen experts' bytes, which is the bound to reach.

Nothing is read back to the host: the grid is sized by an upper bound on the padded length
(pairs + one partial block per expert that can be non-empty), blocks past the real length
return at once, so a captured CUDA graph replays it for any routing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, weight_ptr, sorted_pairs_ptr, block_experts_ptr, padded_len_ptr,
                         num_pairs, N, K, stride_am, stride_be, stride_bn, stride_bk, stride_cm,
                         ROWS_PER_TOKEN: tl.constexpr, MUL_WEIGHT: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c[pair] = a[pair // ROWS_PER_TOKEN] @ b[expert].T (times the pair's weight if MUL_WEIGHT)
    for the BLOCK_M pairs of this block; b is [E, N, K] (an nn.Linear weight per expert)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(padded_len_ptr):
        return  # past the padded pairs: this routing needs fewer blocks than the grid's bound
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    real = pairs < num_pairs  # the rest is padding
    rows = (pairs // ROWS_PER_TOKEN).to(tl.int64)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + expert * stride_be + cols[None, :] * stride_bn + ks[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks < K - k0
        a = tl.load(a_ptrs, mask=real[:, None] & k_ok[None, :], other=0.)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (cols[None, :] < N), other=0.)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32 weights: exact, not tf32
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:  # the epilogue: the routing weight, on the accumulator before it is stored
        acc *= tl.load(weight_ptr + pairs, mask=real, other=0.).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=real[:, None] & (cols[None, :] < N))


def choose_block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per block: 16 (tl.dot's least) while experts get a few pairs each (decode), more
    when each expert's run is long (prefill), so one weight tile serves more rows."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int):
    """The layout above, sync-free. ids [T, k] -> (sorted_pairs [bound] int32, padding = T*k;
    block_experts [bound / block_m] int32; padded_len [1] int32: the used length)."""
    flat = ids.reshape(-1)
    num_pairs = flat.numel()
    bound = num_pairs + min(num_pairs, num_experts) * (block_m - 1)  # each used expert pads < block_m
    bound = triton.cdiv(bound, block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount, without its host sync
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=ids.device) - (counts.cumsum(0) - counts)[expert_of]
    sorted_pairs = torch.full((bound,), num_pairs, dtype=torch.int32, device=ids.device)
    sorted_pairs[(padded_end - padded)[expert_of] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, bound, block_m, device=ids.device)
    block_experts = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_pairs, block_experts.to(torch.int32), padded_end[-1:].to(torch.int32)


def grouped_gemm(a, w, sorted_pairs, block_experts, padded_len, num_pairs, rows_per_token, block_m,
                 weights=None) -> torch.Tensor:
    """[num_pairs, N]: row p = a[p // rows_per_token] @ w[expert of p].T (* weights[p])."""
    n, k = w.shape[1], w.shape[2]
    out = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    block_n, block_k = 64, 64 if a.element_size() < 4 else 32
    grid = (sorted_pairs.numel() // block_m, triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, w, out, weights if weights is not None else out, sorted_pairs, block_experts, padded_len,
        num_pairs, n, k, a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        ROWS_PER_TOKEN=rows_per_token, MUL_WEIGHT=weights is not None, IEEE=a.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=3)
    return out


def fused_moe(experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Stage 01's `naive_experts`, in two grouped launches: sum over each token's chosen experts
    of weight * down(silu(gate(x)) * up(x)). experts: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""
    from ..silu_mul import silu_mul

    tokens, k = ids.shape
    if tokens == 0:
        return torch.zeros_like(x)
    num_experts = experts.gate_up_proj.shape[0]
    block_m = choose_block_m(tokens * k, num_experts)
    layout = align_pairs(ids, num_experts, block_m)
    x = x.contiguous()
    gate_up = grouped_gemm(x, experts.gate_up_proj, *layout, tokens * k, k, block_m)        # [T*k, 2I]
    down = grouped_gemm(silu_mul(gate_up), experts.down_proj, *layout, tokens * k, 1, block_m,
                        weights=weights.reshape(-1).contiguous())                             # [T*k, H], weighted
    return down.view(tokens, k, -1).sum(dim=1)


def blocked_experts(experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The same layout in PyTorch: each block's rows against its expert's weights, all blocks in
    one bmm per projection. The reference the kernel's layout is tested with, and the torch
    backend's experts inside a captured step (sync-free, unlike stage 04's per-expert loop)."""
    tokens, k = ids.shape
    num_pairs, num_experts, hidden = tokens * k, experts.gate_up_proj.shape[0], x.shape[1]
    block_m = choose_block_m(num_pairs, num_experts)
    sorted_pairs, block_experts, _ = align_pairs(ids, num_experts, block_m)
    real = sorted_pairs < num_pairs
    pairs = sorted_pairs.clamp(max=num_pairs - 1).long()  # padding: any pair, its weight made 0
    rows = x[pairs // k].view(-1, block_m, hidden)
    blocks = block_experts.long()
    gate, up = torch.bmm(rows, experts.gate_up_proj[blocks].transpose(1, 2)).chunk(2, dim=-1)
    down = torch.bmm(F.silu(gate) * up, experts.down_proj[blocks].transpose(1, 2)).view(-1, hidden)
    down = down * torch.where(real, weights.reshape(-1)[pairs], 0.).unsqueeze(1).to(down.dtype)
    return torch.zeros_like(x).index_add_(0, pairs // k, down)


# ---- the sm_90 compile report's cases (compile_report.py) --------------------------------------

QWEN3_30B_A3B = dict(hidden=2048, experts=128, top_k=8, inter=768)  # its MoE layer's shape


def compile_cases(capability: tuple[int, int] = (9, 0)) -> list[dict]:
    """Both launches at Qwen3-30B-A3B's layer shape, bf16, at decode's block (16 rows) and
    prefill's (64): pointers and strides multiples of 16, as a torch launch sees them."""
    s = QWEN3_30B_A3B
    pointers = ["a_ptr", "b_ptr", "c_ptr", "weight_ptr", "sorted_pairs_ptr", "block_experts_ptr", "padded_len_ptr"]
    cases = []
    for name, n, k, rows_per_token, mul in (("gate_up", 2 * s["inter"], s["hidden"], s["top_k"], False),
                                            ("down", s["hidden"], s["inter"], 1, True)):
        for block_m in (16, 64):
            constexprs = {"ROWS_PER_TOKEN": rows_per_token, "MUL_WEIGHT": mul, "IEEE": False,
                          "BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64}
            strides = {"stride_am": k, "stride_be": n * k, "stride_bn": k, "stride_bk": 1, "stride_cm": n}
            signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "weight_ptr": "*bf16",
                         "sorted_pairs_ptr": "*i32", "block_experts_ptr": "*i32", "padded_len_ptr": "*i32",
                         "num_pairs": "i32", "N": "i32", "K": "i32"}
            signature |= {p: ("constexpr" if v == 1 else "i32") for p, v in strides.items()}
            signature |= {p: "constexpr" for p in constexprs}
            constexprs |= {p: 1 for p, v in strides.items() if v == 1}
            cases.append({"name": f"moe {name} Qwen3-30B-A3B block_m={block_m}", "kernel": _grouped_gemm_kernel,
                          "signature": signature, "constexprs": constexprs, "num_warps": 4, "num_stages": 3,
                          "attrs": pointers + ["N", "K"] + [p for p, v in strides.items() if v != 1]})
    return cases
