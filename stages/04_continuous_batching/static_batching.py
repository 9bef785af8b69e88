"""The baseline continuous batching replaces: static batching.

A batch is formed from whatever is waiting, and nobody joins it until its *last* member has
finished: the batch runs to its longest output. Requests that finish early leave a hole that
stays empty, and requests that arrive meanwhile wait for the whole batch.

(Ours is the kind version: a finished request's row stops computing. Classic static batching,
like transformers' batched `generate`, also pads every prompt to the longest and keeps
computing finished rows; the benchmark runs that too.)
"""
from __future__ import annotations

from .scheduler import Scheduler, SchedulerOutput


class StaticBatchScheduler(Scheduler):
    """Admit only into an empty batch; whole prompts, no chunking."""

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        if not self.running:
            super()._admit(out, budget)
