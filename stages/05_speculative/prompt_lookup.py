"""Prompt lookup decoding (Saxena 2023; vLLM's "ngram" method): no model at all.

When an answer quotes its input (summaries, rewrites, code edits, JSON that repeats keys),
the last few generated tokens often appeared before, and what followed them then is a good
guess for what follows now. Search the sequence for the most recent earlier occurrence of
its last n tokens (n from max_ngram down to min_ngram) and propose the k tokens after it.
"""
from __future__ import annotations

from course.s01_decode_loop.sequence import Sequence

from .drafter import Draft, Drafter


class PromptLookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seq: Sequence, k: int) -> Draft:
        return Draft(lookup(seq.all_ids, k, self.max_ngram, self.min_ngram))


def lookup(ids: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The k tokens that followed the latest earlier match of the longest suffix n-gram."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):  # latest match first, never the suffix itself
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []
