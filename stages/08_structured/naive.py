"""The reference mask: try every token against the full matcher, no precomputation.

Each token's bytes are fed to the pushdown automaton from the current state with the raw,
unmemoised step, so this shares nothing with the mask cache but the automaton itself. It is
slow (the whole vocabulary, every step) and obviously right, which makes it the oracle for
the cached masks.
"""
from __future__ import annotations

import numpy as np

from .matcher import GrammarMatcher
from .pda import END


def naive_token_mask(matcher: GrammarMatcher) -> np.ndarray:
    pda, info = matcher.pda, matcher.compiled.info
    mask = np.zeros(info.vocab_size, dtype=bool)
    if matcher.is_terminated():
        return mask
    start = pda.states[matcher.state]
    for t, data in enumerate(info.token_bytes):
        if t in info.stop_ids:
            mask[t] = END in start
        elif data and t not in info.special_ids:
            members = start
            for b in data:
                members = pda.advance(members, b)
                if not members:
                    break
            mask[t] = bool(members)
    return mask
