"""Exercise: the two truncations every sampler has. Fill in the bodies below, then run

    pytest stages/01_decode_loop --exercise

`--exercise` (root conftest.py) puts these functions in place of the reference ones in
`course.s01_decode_loop.sampling`, in that module's namespace (`torch` is there). Without the flag
the tests run the reference. Read `sampling.py` first; its code is the answer, so try before you look.
"""
from __future__ import annotations

import torch


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (along the last dimension), set the rest to -inf; return a new
    tensor. k <= 0 or k >= the vocabulary keeps everything. Ties at the k-th value are all kept."""
    raise NotImplementedError("exercise: stages/01_decode_loop/exercises/sampling.py apply_top_k")


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus: keep the smallest set of most probable tokens whose total probability is >= p.

    Softmax in float32, sort descending with a *stable* sort (equal probabilities: lower id
    first); a token is kept when the probability mass strictly before it is < p (so the top token
    always stays); scatter the decision back to vocabulary order; the rest get -inf."""
    raise NotImplementedError("exercise: stages/01_decode_loop/exercises/sampling.py apply_top_p")
