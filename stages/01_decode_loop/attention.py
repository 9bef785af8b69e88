"""The attention seam: the one place where stages differ inside the model.

The transformer (model.py) never changes from stage to stage. It flattens a batch into
rows of tokens, computes q, k, v for every row, and hands them to an *attention backend*
together with `AttentionMetadata` describing the batch. Stage 01's backend recomputes
full causal attention over the whole sequence; stage 02 keeps K/V in a cache; stage 03
pages it; stage 06 swaps the PyTorch math for Triton kernels. Same model, new backend.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch



@dataclass
class AttentionMetadata:
    """What attention must know about the flat batch of this forward pass.

    The batch holds B sequences; the new tokens of sequence b are rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of q/k/v (vLLM's naming). Later stages subclass
    this to add what their caches need (block tables, slot mapping, ...).
    """

    positions: torch.Tensor     # [T] int64: absolute position of each row's token (for RoPE)
    cu_seqlens_q: torch.Tensor  # [B+1] int64: row offsets of each sequence's new tokens
    seq_lens: torch.Tensor      # [B] int64: each sequence's total length after this step

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.numel()

    def for_layer(self, layer: int) -> "AttentionMetadata":
        """What attention reads in `layer`: this; a paged cache with layer groups (stage 03) gives
        each group's layers their own block tables."""
        return self

    @property
    def query_lens(self) -> torch.Tensor:
        return self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]

    @classmethod
    def for_full_sequences(cls, lengths: list[int], device: torch.device | str = "cpu") -> "AttentionMetadata":
        """Metadata for sequences processed whole, from position 0 (stage 01's only case)."""
        lens = torch.tensor(lengths, dtype=torch.int64, device=device)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=device)
        cu[1:] = lens.cumsum(0)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        return cls(positions=positions, cu_seqlens_q=cu, seq_lens=lens)


class AttentionBackend(ABC):
    """Computes attention for one layer. Backends may keep state (a KV cache) across calls."""

    # each layer's sliding window (None: full attention), () when no layer slides: a backend that
    # serves such a model takes them from the config (its cache's), and the model checks they match
    windows: tuple[int | None, ...] = ()

    # linear-attention layers (families/qwen3_next.py) keep a fixed-size state per sequence instead
    # of K/V. None: no states kept, so such a layer runs whole sequences from an empty state (stage
    # 01's way); an engine that continues sequences hands its backend a state cache here (stage 04's
    # hybrid/: load(layer, b), cuts(b), save(layer, b, rows, state))
    recurrent = None

    # attention sinks (gpt-oss): a model with sinks passes each layer's as forward(..., sinks=[H]),
    # to a backend that says it takes them
    takes_sinks = False

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    # MoE layers' experts: None lets the model run its own (moe/experts.py); a backend that has a
    # faster kernel for its steps (stage 06's graphed one) offers it here
    experts_kernel = None

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, n_heads, d]; k, v: [T, n_kv_heads, d] (already rotated). Returns [T, n_heads, d]."""


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                     window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of one sequence, written out so nothing is hidden.

    q: [Tq, H, d] are the queries at positions q_start .. q_start+Tq-1;
    k, v: [Tk, Hkv, d] are the keys/values at positions 0 .. Tk-1.
    Query i may look at key j only if j <= q_start + i (causality), and, in a sliding-window
    layer, only if j > q_start + i - window: the last `window` positions, itself included.
    sinks: [H] learned logits (gpt-oss's attention sinks), one more term in each head's softmax
    denominator with no value: a head may put weight on "nothing" instead of on some key.
    Grouped-query attention: each of the Hkv K/V heads serves H/Hkv query heads.
    """
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    k = k.repeat_interleave(h // hkv, dim=1)  # [Tk, H, d]
    v = v.repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * d ** -0.5
    q_pos = torch.arange(q_start, q_start + tq, device=q.device)[:, None]
    k_pos = torch.arange(tk, device=q.device)[None, :]
    hidden = k_pos > q_pos
    if window is not None:
        hidden |= k_pos <= q_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = softmax_with_sinks(scores, None if sinks is None else sinks.float()[:, None, None])
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim, with each sink logit (broadcast to scores[..., :1]) one more term
    in its denominator: weight given to no key at all."""
    if sinks is None:
        return scores.softmax(dim=-1)
    return torch.cat([scores, sinks.expand_as(scores[..., :1])], dim=-1).softmax(dim=-1)[..., :-1]


class FullCausalAttention(AttentionBackend):
    """Stage 01: no memory at all. Every forward pass carries every token of every sequence,
    so each sequence attends over exactly the rows it brought."""
    takes_sinks = True

    def __init__(self, windows: tuple[int | None, ...] = ()):
        self.windows = tuple(windows)

    def forward(self, layer, q, k, v, meta, sinks=None):
        if not torch.equal(meta.query_lens, meta.seq_lens):
            raise ValueError("FullCausalAttention needs whole sequences (it has no KV cache): "
                             "each sequence's query length must equal its total length")
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            out[start:end] = causal_attention(q[start:end], k[start:end], v[start:end], q_start=0,
                                              window=self.window(layer), sinks=sinks)
        return out
