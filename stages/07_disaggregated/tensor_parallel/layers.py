"""The parallel layers (Megatron-LM's), each built from one rank's slice of a full layer.

    column-parallel  W [out, in]: rank r keeps rows    r*out/N ..  -> its part of the output; no talk
    row-parallel     W [out, in]: rank r keeps columns r*in/N  ..  -> a partial sum; ALL-REDUCE
    vocab-parallel   the embedding / lm_head rows of the (padded) vocabulary: r*Vp .. (r+1)*Vp

A column-parallel layer feeding a row-parallel one needs no communication between them: rank
r's output columns are exactly the input columns its row-parallel slice reads. So attention
(q/k/v column, o row) and the MLP (gate/up column, down row) each end in one all-reduce.
Column-parallel layers are plain nn.Linear holding fewer rows (sharding.py cuts them);
the three classes here are the ones that talk.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import Collectives


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W_r^T) + b: each rank multiplies its input columns, the sum is the
    full product. The bias is added once, after the sum (added on every rank it would count N times)."""

    def __init__(self, full: nn.Linear, comm: Collectives):
        super().__init__()
        n, r = comm.world_size, comm.rank
        width = full.in_features // n
        self.weight = nn.Parameter(full.weight.detach()[:, r * width:(r + 1) * width].clone(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class ReducedOutput(nn.Module):
    """A whole block whose output is a sum of per-rank parts (an MoE layer with every expert cut
    column/row-wise: each rank's experts give partial sums), followed by its one all-reduce."""

    def __init__(self, block: nn.Module, comm: Collectives):
        super().__init__()
        self.block, self.comm = block, comm

    def forward(self, x, attn=None):
        return self.comm.all_reduce(self.block(x, attn))


def vocab_shard_rows(vocab_size: int, world_size: int) -> int:
    """Rows of the vocabulary each rank holds: the vocabulary padded up to a multiple of N, over N."""
    return -(-vocab_size // world_size)


def vocab_slice(weight: torch.Tensor, comm: Collectives) -> torch.Tensor:
    """Rank r's rows r*Vp .. (r+1)*Vp of `weight` [V, H], zero rows where they pass V (padding)."""
    rows = vocab_shard_rows(weight.shape[0], comm.world_size)
    out = weight.new_zeros(rows, weight.shape[1])
    part = weight.detach()[comm.rank * rows:(comm.rank + 1) * rows]
    out[:part.shape[0]] = part
    return out


class VocabParallelEmbedding(nn.Module):
    """Each rank looks up the ids in its rows, zeros for the others; the all-reduce fills them in."""

    def __init__(self, full: nn.Embedding, comm: Collectives):
        super().__init__()
        self.weight = nn.Parameter(vocab_slice(full.weight, comm), requires_grad=False)
        self.start, self.comm = comm.rank * self.weight.shape[0], comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return self.comm.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class VocabParallelHead(nn.Module):
    """Each rank scores its rows of the vocabulary; an all-gather lays the parts side by side and
    the padding columns are cut, so every rank holds the full logits and sampling is TP=1's.

    `leader` is set on rank 0 only (channel.py): when rank 0 asks for logits outside a step (a
    request's prompt logprobs), the other ranks are told to join the gather first."""

    def __init__(self, weight: nn.Parameter, vocab_size: int, comm: Collectives):
        super().__init__()
        self.weight, self.vocab_size, self.comm = weight, vocab_size, comm  # weight: tied or its own slice
        self.leader = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.leader is not None and not self.leader.in_step:
            with self.leader.step(("logits", hidden.detach().cpu())):
                return self._gather(hidden)
        return self._gather(hidden)

    def _gather(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_last(F.linear(hidden, self.weight))[..., :self.vocab_size]
