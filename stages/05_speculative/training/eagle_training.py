"""Training-time test (EAGLE-3, Li et al. 2025): train the head the way it drafts.

Drafting runs the head in a chain: step 0 reads the target's true feature f_b, step 1 reads the
head's own guess f^_{b+1}, step 2 reads f^_{b+2}, ... Trained only on true features (EAGLE-1),
the head never sees its own errors, and deeper drafts get worse fast. Here one batch is unrolled
for `steps` chained steps, all positions at once: step j's input at row t is step j-1's output at
row t-1, which is the chain started at base b = t - j. Attention follows drafting exactly: in the
chain from base b, the query at b + j sees the cache of true entries (positions <= b) and the
chain's own entries at b+1 .. b+j. So at step j row t attends to step 0's keys at positions
<= t - j and to step i's key at position t - j + i (i = 1..j): one causal block plus j diagonals.

The loss of each step is EAGLE's (SmoothL1 to the true next feature + w_cls x cross-entropy to
the target's next-token distribution; an EAGLE-3 head, which predicts no feature, has only the
cross-entropy), only on rows whose chain has a base (t >= j) and whose predicted token lies in
the answer. Step 0 reads `head.input_features` of the target's features (for EAGLE-3: its
three layers, fused), so the fusing layer trains with the rest.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata

from ..eagle import EagleHead

CLS_WEIGHT = 0.1    # the EAGLE paper's w_cls
STEP_DECAY = 0.8    # step j's loss weighs STEP_DECAY**j (EAGLE-3 weighs later steps less)


def chained_attention(q: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Attention of chained step j = len(kv) - 1 over one sequence. q: [L, H, d]; kv[i] = (k, v)
    of step i, each [L, Hkv, d]. Returns [L, H, d]."""
    length, heads, d = q.shape
    j, group = len(kv) - 1, heads // kv[0][0].shape[1]
    k0, v0 = (x.repeat_interleave(group, dim=1).float() for x in kv[0])
    qf = q.float() * d ** -0.5
    rows = torch.arange(length, device=q.device)
    scores = torch.einsum("qhd,khd->hqk", qf, k0)
    scores = scores.masked_fill(rows[None, :] > rows[:, None] - j, float("-inf"))  # true entries <= t - j
    diagonals, values = [], []
    for i in range(1, j + 1):  # step i's entry at t - j + i: rows move down by j - i
        shift = j - i
        ki, vi = (torch.cat([x.new_zeros((shift, *x.shape[1:])), x[:length - shift]]).repeat_interleave(group, dim=1)
                  .float() for x in kv[i])
        score = (qf * ki).sum(-1).T  # [H, L]
        diagonals.append(score.masked_fill(rows[None, :] < shift, float("-inf")))  # no such entry
        values.append(vi)
    probs = torch.cat([scores, torch.stack(diagonals, -1)], -1).softmax(-1) if diagonals else scores.softmax(-1)
    out = torch.einsum("hqk,khd->qhd", probs[..., :length], v0)
    for i, vi in enumerate(values):
        out = out + probs[..., length + i].T[..., None] * vi
    return out.to(q.dtype)


class UnrolledAttention(AttentionBackend):
    """The head's attention across chained steps: each call is the next step, and keeps its K/V."""

    def __init__(self):
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, layer, q, k, v, meta):
        self.kv.append((k, v))
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            out[start:end] = chained_attention(q[start:end], [(a[start:end], b[start:end]) for a, b in self.kv])
        return out


def unrolled_predictions(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor,
                         meta: AttentionMetadata, steps: int) -> list[torch.Tensor]:
    """Step j's predicted features for every row ([T, h] each): row t of step j is the chain from
    base t - j after j + 1 head steps, predicting f_{t+1}. embeds[t] is token t+1's embedding;
    features[t] is what the target's forward gave at t (`head.input_features` reads it)."""
    attn, preds, inputs = UnrolledAttention(), [], head.input_features(features)
    starts = meta.cu_seqlens_q[:-1]
    for _ in range(steps):
        preds.append(head(inputs, embeds, attn, meta))
        inputs = torch.cat([preds[-1].new_zeros(1, preds[-1].shape[1]), preds[-1][:-1]])  # row t <- t - 1
        inputs = inputs.index_fill(0, starts, 0.0)  # a sequence's first row has no step before it
    return preds


def rows_with_base(meta: AttentionMetadata, step: int) -> torch.Tensor:
    """[T] bool: rows whose chain base t - step lies inside their own sequence."""
    local = torch.arange(int(meta.cu_seqlens_q[-1]), device=meta.cu_seqlens_q.device)
    local = local - torch.repeat_interleave(meta.cu_seqlens_q[:-1], meta.query_lens)
    return local >= step


def step_losses(head: EagleHead, target, preds: list[torch.Tensor], true_next: torch.Tensor,
                counted: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """sum_j STEP_DECAY**j x (SmoothL1 + CLS_WEIGHT x CE) over the rows each step can count (an
    EAGLE-3 head: the CE alone). true_next are the target's final hidden states at t+1. The
    cross-entropy runs over the head's draft vocabulary when it has one (both sides)."""
    vocab = head.draft_vocab
    weight = target.lm_head.weight if vocab is None else target.lm_head.weight[vocab]
    total = preds[0].new_zeros(())
    for j, pred in enumerate(preds):
        rows = counted & rows_with_base(meta, j)
        if not rows.any():
            continue
        predicted, true = pred[rows], true_next[rows]
        with torch.no_grad():
            target_probs = F.linear(true, weight).float().softmax(-1)
        ce = -(target_probs * F.linear(head.readout(predicted), weight).float().log_softmax(-1)).sum(-1).mean()
        if head.predicts_features:
            total = total + STEP_DECAY ** j * (F.smooth_l1_loss(predicted, true) + CLS_WEIGHT * ce)
        else:
            total = total + STEP_DECAY ** j * ce
    return total


@torch.no_grad()
def chain_hits(head: EagleHead, target, preds: list[torch.Tensor], true_next: torch.Tensor) -> torch.Tensor:
    """[steps, T] bool: step j's drafted token at row t equals the target's greedy token (the
    argmax of its full vocabulary at f_{t+1}: a token outside the draft vocabulary is a miss)."""
    want = target.compute_logits(true_next).argmax(-1)
    return torch.stack([head.draft_logits(target, p).argmax(-1) == want for p in preds])


def accepted_lengths(hits: torch.Tensor, bases: torch.Tensor, k: int) -> torch.Tensor:
    """Greedy chain of k drafts from each base row b: 1 + the number of leading hits along
    hits[0, b], hits[1, b+1], ... (the tokens one target forward emits). bases: rows whose chain
    of k rows stays inside the sequence."""
    run = torch.ones_like(bases, dtype=torch.bool)
    length = torch.ones(bases.shape, dtype=torch.float32)
    for j in range(k):
        run = run & hits[j, bases + j]
        length += run.float()
    return length
