"""Verification: which drafted tokens the target keeps, so that the output is the target's.

The target runs once over [last token, d_1, ..., d_k] and so has its next-token distribution
p_i at every drafted position (p_0 predicts d_1's slot, ..., p_k the slot after d_k).

Greedy: keep d_i while it equals argmax p_{i-1}; at the first mismatch emit argmax there
instead. If all k match, p_k gives one more token for free (the "bonus"). Every forward
therefore emits between 1 and k+1 tokens, all of them what greedy decoding would emit.

Sampled (Leviathan et al. 2023; Chen et al. 2023): a drafter proposed d_i from its own
distribution q_i. Keep d_i with probability min(1, p(d_i) / q(d_i)); on the first rejection
draw a replacement from norm(max(p - q, 0)) and stop. The emitted token is then distributed
exactly as p: P(d accepted) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(q(x), p(x)), and the
residual max(p - q, 0) supplies precisely the mass that acceptance misses. A drafter with no
distribution (prompt lookup) is a point mass: q = one-hot(d).
"""
from __future__ import annotations

import torch


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> list[int]:
    """target_logits: [k+1, vocab] (already processed: penalties applied). Returns the tokens
    to emit: the accepted prefix of `draft`, then the target's own token."""
    return accept_greedy(torch.argmax(target_logits, dim=-1).tolist(), draft)


def accept_greedy(choices: list[int], draft: list[int]) -> list[int]:
    """verify_greedy on the target's argmax tokens already read to the host (an engine reads
    a whole step's at once: one sync, not one per request)."""
    out = []
    for i, d in enumerate(draft):
        if d != choices[i]:
            break
        out.append(d)
    out.append(choices[len(out)])  # the correction at the first mismatch, or the bonus token
    return out


def verify_sampled(target_probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator) -> list[int]:
    """target_probs: [k+1, vocab]; draft_probs: [k, vocab], or None for a point-mass drafter.
    Returns the accepted prefix of `draft` plus one token drawn from the target's side."""
    out = []
    for i, d in enumerate(draft):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else one_hot(d, p)
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[d] < p[d]:  # u < p/q without dividing by a zero q
            out.append(d)
            continue
        out.append(draw(residual(p, q), generator))
        return out
    out.append(draw(target_probs[len(draft)], generator))  # all accepted: the bonus token
    return out


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): where the target wants more mass than the draft gave."""
    r = (p - q).clamp_(min=0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q: a rejection cannot happen; stay safe


def one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))
