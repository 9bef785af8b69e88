"""StepRecorder: the engine's memory after every step, for pictures and for checks.

    recorder = StepRecorder(engine)
    while engine.has_unfinished():
        recorder.step()                 # engine.step(), then a Snapshot of the pool
    recorder.snapshots                  # one per step that ran

A snapshot reads only the engine's public state: the block manager's tables (request id ->
its block ids, in order) and free lists, the scheduler's queues, and the step log's chunks and
preemptions. Nothing in the engine changes; bench/plots.py draws these (the pool stacked by
request, the pool's blocks over time coloured by owner, a preemption and its blocks coming back).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine import LLMEngine

# owner codes in `pool_owners`: an empty block; a free block that keeps a cached prefix; a block
# in several tables at once (a shared prefix, e.g. the chat template's system prompt)
FREE, CACHED, SHARED = -1, -2, -3


@dataclass
class Snapshot:
    step: int
    tables: dict[int, list[int]]      # request id -> its block ids (logical order), after the step
    num_blocks: int
    empty_blocks: int                 # free and holding nothing
    cached: list[int]                 # free block ids that still hold a named full block (prefix cache)
    chunks: list[tuple[int, int]]     # (request id, tokens computed this step)
    preempted: list[int]              # requests whose blocks were freed this step, to be recomputed
    finished: list[int]               # requests that finished this step
    running: list[int]
    waiting: list[int]

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.empty_blocks - len(self.cached)

    def pool_owners(self) -> list[int]:
        """For each physical block: the request id whose table holds it, else SHARED, CACHED or FREE."""
        owners = [FREE] * self.num_blocks
        for b in self.cached:
            owners[b] = CACHED
        for rid, table in self.tables.items():
            for b in table:
                owners[b] = rid if owners[b] == FREE else SHARED
        return owners


class StepRecorder:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.snapshots: list[Snapshot] = []

    def step(self):
        """One engine step, then its snapshot (none when the step scheduled nothing)."""
        logged = len(self.engine.step_log)
        outputs = self.engine.step()
        if len(self.engine.step_log) > logged:
            log = self.engine.step_log[-1]
            finished = [o.request_id for o in outputs if o.error is not None or o.event.finish_reason]
            self.snapshots.append(self.snapshot([(rid, n) for rid, n, _ in log["chunks"]], log["preempted"], finished))
        return outputs

    def run(self) -> list[Snapshot]:
        """Step until every request has finished."""
        while self.engine.has_unfinished():
            self.step()
        return self.snapshots

    def snapshot(self, chunks, preempted, finished) -> Snapshot:
        blocks, sched = self.engine.blocks, self.engine.scheduler
        return Snapshot(step=len(self.snapshots), tables={rid: list(t) for rid, t in blocks.tables.items()},
                        num_blocks=blocks.num_blocks, empty_blocks=len(blocks.free_ids),
                        cached=list(blocks.cached_free.values()), chunks=chunks, preempted=list(preempted),
                        finished=finished, running=[r.request_id for r in sched.running],
                        waiting=[r.request_id for r in sched.waiting])
