"""A request inside the engine: stage 01's `Sequence` (sampling, detokenizing, stopping) plus
what a scheduler needs: a status, how many of its tokens already have K/V in the cache, and
timestamps for the metrics."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from course.s01_decode_loop.sequence import Sequence


class Status(enum.Enum):
    WAITING = "waiting"      # queued, nothing cached
    RUNNING = "running"      # holds blocks; prefilling (maybe in chunks) or decoding
    PREEMPTED = "preempted"  # lost its blocks under memory pressure; will recompute
    PAUSED = "paused"        # queued but keeps its blocks: gave its seat to a higher-ranked request
    FINISHED = "finished"    # done: see finish_reason ("stop", "length", "abort", "error")


@dataclass(eq=False)  # a request is equal only to itself (and `req in running` stays cheap)
class Request:
    request_id: int
    seq: Sequence
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens of seq.all_ids whose K/V are in the cache
    first_scheduled_time: float | None = None
    finish_reason: str | None = None
    error: Exception | None = None  # why it failed, when finish_reason is "error"
    num_preemptions: int = 0
    priority: int = 0  # for the Priority policy: lower runs first (vLLM's convention); kept across preemption

    @property
    def arrival_time(self) -> float:
        return self.seq.start_time  # the Sequence is created when the request arrives

    @property
    def all_ids(self) -> list[int]:
        return self.seq.all_ids

    @property
    def num_tokens(self) -> int:
        return len(self.seq.all_ids)  # with a token sampled on the device but not read yet (stage 06)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model before this request can sample again:
        the (rest of the) prompt at first, one token per step once decoding, and everything
        again after a preemption."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def metrics(self) -> dict:
        out = self.seq.output()
        queue = (self.first_scheduled_time or self.arrival_time) - self.arrival_time
        return {"queue_s": queue, "ttft_s": out.ttft_s if out.token_ids else None, "tpot_s": out.tpot_s,
                "e2e_s": out.token_times_s[-1] if out.token_ids else None,
                "num_preemptions": self.num_preemptions}
