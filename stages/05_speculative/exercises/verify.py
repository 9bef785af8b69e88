"""Exercise: verification, the rule that keeps speculative output the target's. Fill in the
three bodies below, then run

    pytest stages/05_speculative --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s05_speculative.verify`, everywhere they are used (the loops in speculative.py too),
and they run in that module's namespace (`torch`, `draw`, `one_hot`, and your own `residual`).
Without the flag the tests run the reference. Read `verify.py`'s module docstring first (it
derives why the residual makes rejection sampling exact); its code is the answer, so try
before you look.
"""
from __future__ import annotations

import torch

from course.s05_speculative.verify import draw, one_hot  # noqa: F401  (what a solution may need)


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> list[int]:
    """target_logits: [k+1, vocab] (already processed: penalties applied). Returns the tokens
    to emit: the accepted prefix of `draft`, then the target's own token.

    Keep draft[i] while it equals the argmax of row i; then append the argmax of the first row
    that did not match (the correction), or of row k when all matched (the bonus token). Take
    every row's argmax in one call and move it to the host once (`.tolist()`)."""
    raise NotImplementedError("exercise: stages/05_speculative/exercises/verify.py verify_greedy")


def verify_sampled(target_probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator) -> list[int]:
    """target_probs: [k+1, vocab]; draft_probs: [k, vocab], or None for a point-mass drafter.
    Returns the accepted prefix of `draft` plus one token drawn from the target's side.

    For each draft token d at row i: p = target_probs[i], q = draft_probs[i] (or
    `one_hot(d, p)`); draw u = torch.rand((), generator=generator, device=p.device) and keep d
    when u * q[d] < p[d] (u < p/q without dividing by zero). On the first rejection append
    `draw(residual(p, q), generator)` and stop. If every draft was kept, append
    `draw(target_probs[k], generator)`. Draw exactly in this order: the tests are seeded."""
    raise NotImplementedError("exercise: stages/05_speculative/exercises/verify.py verify_sampled")


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): where the target wants more mass than the draft gave.

    If p - q is nowhere positive (p == q), return p: a rejection cannot happen then, but the
    function must still return a distribution."""
    raise NotImplementedError("exercise: stages/05_speculative/exercises/verify.py residual")
