"""The scheduler: at every iteration, decide which requests run and how many of their tokens.

Every request carries `num_computed_tokens`; what it still needs is `num_uncomputed` (its
whole prompt at first, one token per step while decoding, everything again after a
preemption). One rule covers prefill, chunked prefill and decode (the way vLLM's v1 scheduler
and Sarathi-Serve think of it): hand out a token budget per step,

  1. to running requests first, in the policy's order: decodes take 1 token, an unfinished
     prefill takes what is left of the budget (a *chunk*), so a long prompt never stalls the
     decodes of everyone else;
  2. then to waiting requests, in the policy's order, while the budget, the sequence limit and
     the free blocks allow. Nobody overtakes: when the head of the queue does not fit, it waits.

When a running request needs a block and none is free, the lowest-ranked running request is
*preempted*: its blocks are freed and it goes back to the queue, to be recomputed later
(prefix caching usually makes that cheap: its full blocks are still cached).

This is first come, first served (policy.py's FCFS), or any policy that only reorders. A policy
that lets a waiting request push a running one out (priorities, final/'s MLFQ) runs on
`PriorityScheduler` (priority_scheduler.py), which adds that step before these two.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from course.s03_paged.block_manager import BlockManager

from .policy import FCFS, Priority, SchedulingPolicy  # noqa: F401 (re-exported: the policies live in policy.py)
from .request import Request, Status


@dataclass
class SchedulerOutput:
    chunks: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class Scheduler:
    displaces = False  # PriorityScheduler: a waiting request may take a running one's place
    num_pauses = 0     # requests that gave their seat up (PriorityScheduler's; never here)

    def __init__(self, blocks: BlockManager, max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                 enable_chunked_prefill: bool = True, policy: SchedulingPolicy | None = None):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy or FCFS()
        if self.policy.displaces and not self.displaces:
            raise ValueError(f"the {type(self.policy).__name__} policy displaces running requests: "
                             "schedule it with PriorityScheduler (priority_scheduler.py)")
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)
        self.policy.on_add(request)

    def schedule(self) -> SchedulerOutput:
        out, budget = SchedulerOutput(), self.max_num_batched_tokens
        self.running.sort(key=self.policy.priority)
        for req in list(self.running):  # 1. the running requests
            if budget == 0 or req not in self.running:  # out of budget, or preempted just now
                continue
            n = self._tokens_for(req, budget)
            if n == 0:
                continue
            if self._make_room(req, req.num_computed_tokens + n, out):
                out.chunks.append((req, n))
                budget -= n
        if not out.preempted:  # 2. the waiting ones, unless memory ran short: then no one new this step
            self._admit(out, budget)
        self.policy.on_step(out)
        return out

    def _tokens_for(self, req: Request, budget: int) -> int:
        need = req.num_uncomputed
        if self.enable_chunked_prefill or need > self.max_num_batched_tokens:
            # (the second case: a preempted request recomputing more than any step can hold would
            # wait forever without chunks; admission keeps prompts within the budget)
            return min(need, budget)
        return need if need <= budget else 0  # without chunking a prompt runs whole or waits

    def _make_room(self, req: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Ensure `req` has blocks for `num_tokens`, preempting from the back if needed."""
        while self.blocks.blocks_needed(num_tokens) - len(self.blocks.tables[req.request_id]) > \
                self.blocks.num_free_blocks:
            victim = self.policy.choose_victim(self.running, self._paused())  # FCFS: the last running
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        self.blocks.append_slot(req.request_id, num_tokens)
        return True

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        self.waiting.sort(key=self.policy.priority)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            resident = self._is_resident(req)  # it holds its blocks already (paused, or its K/V were sent)
            if not resident and not self._fits(req, out, budget):
                break  # no overtaking; the head waits until blocks free up
            if not resident:  # (with a sliding window: blocks for this step's tokens only)
                req.num_computed_tokens = self.blocks.allocate(req.request_id, req.all_ids, budget)
            n = self._tokens_for(req, budget)
            if n == 0 or (resident and not self._fits(req, out, n)):  # not in this step's budget (chunking
                if not resident:                                       # off), or no block for its next tokens
                    self.blocks.free(req.request_id)
                    req.num_computed_tokens = 0
                break
            if resident:
                self.blocks.append_slot(req.request_id, req.num_computed_tokens + n)
            elif self.blocks.window is not None:  # a sliding window: a long prompt's blocks come chunk by
                self.blocks.truncate(req.request_id, req.num_computed_tokens + n)  # chunk, and go behind it
            self.waiting.pop(0)
            req.status = Status.RUNNING
            self.running.append(req)
            out.chunks.append((req, n))
            budget -= n

    def _fits(self, req: Request, out: SchedulerOutput, n: int = 0) -> bool:
        """May `req` be admitted: is there memory for its prompt (with a window: for its next n
        tokens), or for n more tokens if it holds blocks already? (PriorityScheduler may also free
        some for it.)"""
        return self._room(req, n)

    def _room(self, req: Request, n: int) -> bool:
        if not self._is_resident(req):
            return self.blocks.can_allocate(req.all_ids, n or None)
        missing = self.blocks.blocks_needed(req.num_computed_tokens + n) - len(self.blocks.tables[req.request_id])
        return missing <= self.blocks.num_free_blocks

    def _is_resident(self, req: Request) -> bool:
        return req.request_id in self.blocks.tables

    def _paused(self) -> list[Request]:
        """Waiting requests that hold blocks and run nothing: paused ones (PriorityScheduler), or
        stage 07's, whose K/V came from another worker. A policy may pick them as victims."""
        return [r for r in self.waiting if r.status is Status.PAUSED]

    def preempt(self, req: Request) -> None:
        """Free the victim's blocks and queue it again; it will recompute what it had."""
        if req in self.running:  # a paused victim is already in the queue
            self.running.remove(req)
            self.waiting.append(req)
        self.blocks.free(req.request_id)
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request wherever it is and free its blocks at once."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.request_id in self.blocks.tables:
            self.blocks.free(req.request_id)
        req.status = Status.FINISHED
        self.policy.on_finish(req)
