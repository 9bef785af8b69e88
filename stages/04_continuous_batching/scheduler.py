"""The scheduler: at every iteration, decide which requests run and how many of their tokens.

Every request carries `num_computed_tokens`; what it still needs is `num_uncomputed` (its
whole prompt at first, one token per step while decoding, everything again after a
preemption). One rule covers prefill, chunked prefill and decode (the way vLLM's v1 scheduler
and Sarathi-Serve think of it): hand out a token budget per step,

  1. to running requests first, in priority order: decodes take 1 token, an unfinished
     prefill takes what is left of the budget (a *chunk*), so a long prompt never stalls the
     decodes of everyone else;
  2. then to waiting requests, in priority order, while the budget, the sequence limit and
     the free blocks allow.

When a running request needs a block and none is free, the lowest-priority running request is
*preempted*: its blocks are freed and it goes back to the queue, to be recomputed later
(prefix caching usually makes that cheap: its full blocks are still cached).

Which request ranks first, and whether a waiting request may push a running one out, is the
policy's to say (policy.py). With FCFS nobody is ever pushed out. A policy that displaces
(priorities, final/'s MLFQ) gets step 0 before the two above:

  0. while the best waiting request outranks the lowest running one, it takes that one's
     place: the displaced request is *paused* when only its seat was needed (it keeps its
     blocks and resumes without recompute), and the lowest-ranked residents are preempted
     when memory is short (paused ones count: they hold blocks and run nothing).
"""
from __future__ import annotations

from bisect import insort
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
    def __init__(self, blocks: BlockManager, max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                 enable_chunked_prefill: bool = True, policy: SchedulingPolicy | None = None):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy or FCFS()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_pauses = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)
        self.policy.on_add(request)

    def schedule(self) -> SchedulerOutput:
        out, budget = SchedulerOutput(), self.max_num_batched_tokens
        self.running.sort(key=self.policy.priority)
        if self.policy.displaces:
            self._displace(out)
        displaced = len(out.preempted)
        for req in list(self.running):
            if budget == 0 or req not in self.running:  # out of budget, or preempted just now
                continue
            n = self._tokens_for(req, budget)
            if n == 0:
                continue
            if self._make_room(req, req.num_computed_tokens + n, out):
                out.chunks.append((req, n))
                budget -= n
        if len(out.preempted) == displaced:  # under memory pressure, admit no one new this step
            self._admit(out, budget)
        self.policy.on_step(out)
        return out

    def _displace(self, out: SchedulerOutput) -> None:
        """Step 0 (displacing policies only): while the best waiting request outranks the lowest
        running one, it takes that one's seat (pausing it) and, if memory is short, blocks from
        residents it outranks. It joins the running set in rank order, before the budget is
        handed out, so a low-ranked long prefill cannot keep it waiting for budget either."""
        self.waiting.sort(key=self.policy.priority)
        while self.waiting and self.running and self.policy.may_displace(self.waiting[0], self.running[-1]):
            head = self.waiting[0]
            if len(self.running) >= self.max_num_seqs:
                self.pause(self.running[-1])  # appended to the queue: head stays first
            if not self._is_resident(head) and not self._reclaim(head, out, from_running=True):
                return
            self.waiting.pop(0)
            if not self._is_resident(head):
                head.num_computed_tokens = self.blocks.allocate(head.request_id, head.all_ids)
            head.status = Status.RUNNING
            insort(self.running, head, key=self.policy.priority)

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
            resident = self._is_resident(req)  # paused: its blocks are still there
            if not resident and not self._fits(req, out):
                break  # no overtaking; the head waits until blocks free up
            if not resident:
                req.num_computed_tokens = self.blocks.allocate(req.request_id, req.all_ids)
            n = self._tokens_for(req, budget)
            if n == 0 or (resident and not self._fits(req, out, n)):  # not in this step's budget (chunking
                if not resident:                                       # off), or no block for a paused one
                    self.blocks.free(req.request_id)
                    req.num_computed_tokens = 0
                break
            if resident:
                self.blocks.append_slot(req.request_id, req.num_computed_tokens + n)
            self.waiting.pop(0)
            req.status = Status.RUNNING
            self.running.append(req)
            out.chunks.append((req, n))
            budget -= n

    def _fits(self, req: Request, out: SchedulerOutput, n: int = 0) -> bool:
        """Is there memory for `req` (its prompt; n more tokens if it is paused)? A displacing
        policy may free some from paused requests ranked below it."""
        return self._room(req, n) or (self.policy.displaces and self._reclaim(req, out, False, n))

    def _reclaim(self, head: Request, out: SchedulerOutput, from_running: bool, n: int = 0) -> bool:
        """Preempt residents `head` outranks until it fits: paused ones (they hold blocks and run
        nothing) and, at step 0, running ones the policy lets it displace. True when it fits."""
        rank = self.policy.priority(head)
        while not self._room(head, n):
            paused = [r for r in self._paused() if self.policy.priority(r) > rank]
            running = self.running if from_running and self.running and \
                self.policy.may_preempt(head, self.running[-1]) else []
            if not paused and not running:
                return False
            victim = self.policy.choose_victim(running, paused)
            self.preempt(victim)
            out.preempted.append(victim)
        return True

    def _room(self, req: Request, n: int) -> bool:
        if not self._is_resident(req):
            return self.blocks.can_allocate(req.all_ids)
        missing = self.blocks.blocks_needed(req.num_computed_tokens + n) - len(self.blocks.tables[req.request_id])
        return missing <= self.blocks.num_free_blocks

    def _is_resident(self, req: Request) -> bool:
        return req.request_id in self.blocks.tables

    def _paused(self) -> list[Request]:
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

    def pause(self, req: Request) -> None:
        """Take a running request out of the running set but leave it its blocks: it gave its
        seat to a request the policy ranks higher, and resumes where it stopped."""
        self.running.remove(req)
        req.status = Status.PAUSED
        self.num_pauses += 1
        self.waiting.append(req)

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
