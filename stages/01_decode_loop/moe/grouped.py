"""The experts of one MoE layer for many rows at once, grouped by expert: how the model computes
its experts, for one sequence or for a whole batched step (stage 04's engine asks nothing).

The reference loop (`naive_experts`) runs each token through each of its k experts: T * k
products of one row, every one streaming its expert's weights again. Here the T * k (token, expert) pairs are
sorted by expert once, so each expert that any token chose runs ONE product over all of its
rows, and the weighted results go back to their tokens with one index_add:

    ids [T, k] ──flatten, sort──► pairs by expert: e0 e0 e0 | e1 | e3 e3 | ...
    x[token of each pair] ──► per expert: one [n_e, H] x [H, 2I] and one [n_e, I] x [I, H]
    out.index_add_(token of each pair, weight * result)

A step reads each chosen expert once: at one token that is k experts, at many tokens every
expert (stage 04's moe/bytes_per_step.py counts how fast the distinct experts grow with the
batch). Same signature as `naive_experts`, which the tests check it against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sort_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """ids [T, k] -> (the flat (token, slot) pair indices ordered by expert, rows per expert).
    Stable, so each expert's rows keep token order."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # the one host sync of the layer
    return order, counts


def grouped_experts(experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    linear=F.linear) -> torch.Tensor:
    """sum over each token's chosen experts of weight * expert(x), one product per used expert.
    `linear(rows, weight)`: who multiplies (stage 06's CPU room passes its C products)."""
    k = ids.shape[1]
    order, counts = sort_by_expert(ids, experts.gate_up_proj.shape[0])
    tokens = order // k                        # the token of each sorted pair
    rows = x[tokens]                           # [T * k, H], gathered once
    results = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            gate, up = linear(rows[start: start + n], experts.gate_up_proj[e]).chunk(2, dim=-1)
            results[start: start + n] = linear(F.silu(gate) * up, experts.down_proj[e])
            start += n
    results *= weights.reshape(-1)[order].unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, tokens, results)
