"""The MoE layer: router + E SwiGLU experts, computed by the simplest loop there is."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .grouped import grouped_experts
from .router import route


class Experts(nn.Module):
    """E SwiGLU MLPs, their weights stacked: gate_up_proj [E, 2I, H] (gate rows, then up rows),
    down_proj [E, H, I]. Names and layout are transformers' own, so its state dict loads as is."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [n, H]: down(silu(gate(x)) * up(x))."""
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


class SharedExpert(nn.Module):
    """A plain SwiGLU MLP (the names Qwen2-MoE's checkpoints use)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def naive_experts(experts: Experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The reference: for every token, for each of its k chosen experts, add weight * expert(x).
    T * k small products; a decode step (T = 1) touches only its k experts' weights."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            out[t] += w * experts.expert(e, x[t: t + 1])[0]
    return out


class SparseMoeBlock(nn.Module):
    """Drop-in for the dense MLP of a decoder layer. The weighted sum over each token's experts is
    the model's own business: its rows grouped by expert (grouped.py, equal to `naive_experts`,
    the reference), so one sequence or a whole batched step runs one product per chosen expert.
    A backend with a faster kernel for its steps offers it as `experts_kernel(experts, x,
    weights, ids)`; the engine never needs to know the model has experts."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size:  # Qwen2-MoE: every token also through this one, gated
            self.shared_expert = SharedExpert(config.hidden_size, config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, attn=None) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        kernel = getattr(attn, "experts_kernel", None) or grouped_experts
        out = kernel(self.experts, x, weights.to(x.dtype), ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
