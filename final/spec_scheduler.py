"""Stage 04's scheduler (its PriorityScheduler: every policy runs on it), budgeting k+1 tokens for
a request that carries k drafts.

A decoding request needs one token per step. With k drafted tokens it needs k+1 rows in the
step (its last token and the drafts, verified together), and K/V slots for all of them: the
*lookahead* slots vLLM reserves. Drafts that do not fit this step's budget are dropped; a
request that is not caught up (prefilling, or recomputing after a preemption) drafts nothing.
"""
from __future__ import annotations

from course.s04_continuous_batching.priority_scheduler import PriorityScheduler
from course.s04_continuous_batching.request import Request


class SpeculativeScheduler(PriorityScheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafts: dict[int, list[int]] = {}  # request id -> this step's drafts (the engine fills it)

    def _tokens_for(self, req: Request, budget: int) -> int:
        n = super()._tokens_for(req, budget)
        drafts = self.drafts.get(req.request_id)
        if not drafts:
            return n
        if req.num_uncomputed != 1 or n != 1:  # not a plain decode step: no speculation
            drafts.clear()
            return n
        del drafts[budget - 1:]  # what the budget leaves room for
        return 1 + len(drafts)
