"""The router: which k experts each token goes to, and with what weights."""
from __future__ import annotations

import torch


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64).

    Softmax over all E experts first, then the k largest: a chosen expert's weight is its share
    of the whole distribution, or, renormalised, its share among the chosen (the weights sum to
    1). Equal probabilities go to the lower expert id first, as torch.topk orders them, which is
    also what transformers does, so both pick the same experts even on ties."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
