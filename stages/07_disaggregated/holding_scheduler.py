"""Delayed free: stage 04's scheduler frees a request's blocks the moment it finishes; a prefill
worker must keep them until the decode worker has them (vLLM: `request_finished` returning
"delay free", the blocks freed later when the connector reports the send done)."""
from __future__ import annotations

from course.s04_continuous_batching.request import Request
from course.s04_continuous_batching.scheduler import Scheduler


class HoldingScheduler(Scheduler):
    """Stage 04's scheduler, except that a request listed in `hold_on_finish` keeps its blocks
    when it finishes normally: the engine frees them later (confirm, lease expiry or cancel)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold_on_finish: set[int] = set()

    def finish(self, req: Request) -> None:
        if req.request_id not in self.hold_on_finish or req.finish_reason in ("abort", "error"):
            return super().finish(req)
        # hide the block table from stage 04's finish (which frees whatever it finds), then put it back
        rid = req.request_id
        held = self.blocks.tables.pop(rid), self.blocks.hashed.pop(rid)
        super().finish(req)
        self.blocks.tables[rid], self.blocks.hashed[rid] = held
