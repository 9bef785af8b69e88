"""What every drafter promises: given the sequence so far, up to k guesses for what comes next.

A drafter must be cheap next to the target (or speculation costs more than it saves) and may
be wrong as often as it likes: verification keeps only what the target itself would emit.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from course.s01_decode_loop.sampling import process_logits
from course.s01_decode_loop.sequence import Sequence

from .verify import draw


@dataclass
class Draft:
    tokens: list[int]                   # up to k proposed tokens (may be empty: nothing to guess)
    probs: torch.Tensor | None = None   # [len(tokens), vocab]: the distribution each was drawn from;
    #                                     None: deterministic guesses (point masses), or greedy


class Drafter(ABC):
    name: str

    def begin(self, seq: Sequence) -> None:
        """A new request starts: forget the last one. Drafters that sample reseed here, from the
        request's seed, so a seeded request is reproducible whatever ran before it."""

    @abstractmethod
    def propose(self, seq: Sequence, k: int) -> Draft:
        """Guess up to k tokens to follow seq.all_ids. For sampled requests a drafter that has a
        distribution samples from it (with its own generator) and returns it in `probs`."""

    def features_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """What `observe` reads of the target's last forward, row for row: its final hidden
        states (EAGLE-3: the outputs of three layers, fused by its head). One call serves every
        row of a forward, so a batch pays for the fusion once, not once per request."""
        return hidden

    def observe(self, hidden: torch.Tensor, start: int) -> None:
        """The target's features (`features_of`) at positions start .. start+len-1, each computed on
        tokens the target has kept. Drafters that do not use them (most) ignore this."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def draft_chain(logits: torch.Tensor, next_logits: Callable[[int, int], torch.Tensor], k: int, seq: Sequence,
                generator: torch.Generator) -> Draft:
    """Draft k tokens one after another, for drafters with a distribution (a model, a head).
    Each step processes the logits with the request's own sampling parameters (as if the drafts
    so far were emitted) and takes the argmax (greedy) or a sample, keeping its distribution for
    verification; next_logits(i, token) returns the logits after the i-th drafted token."""
    params, tokens, probs = seq.params, [], []
    for i in range(k):
        processed = process_logits(logits, params, seq.prompt_ids, seq.output_ids + tokens)
        if params.greedy:
            tokens.append(int(torch.argmax(processed)))
        else:
            probs.append(torch.softmax(processed, dim=-1))
            tokens.append(draw(probs[-1], generator))
        if i < k - 1:
            logits = next_logits(i, tokens[-1])
    return Draft(tokens, torch.stack(probs) if probs else None)
