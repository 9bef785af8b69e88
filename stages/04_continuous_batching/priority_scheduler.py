"""PriorityScheduler: the scheduler for a policy that lets a waiting request push a running one
out (policy.py's `Priority`, vLLM's; final/'s skip-join MLFQ). Read scheduler.py first: this adds
one step before its two, and memory for admission taken from the requests it outranks.

  0. while the best waiting request outranks the lowest running one (`policy.may_displace`),
     it takes that one's place, before the budget is handed out (so a low-ranked long prefill
     cannot keep it waiting for budget either):
       - the displaced request is *paused* when only its seat was needed: it keeps its blocks,
         waits in the queue, and resumes without recompute (status PAUSED);
       - when memory is short, the lowest-ranked residents it outranks lose their blocks
         (preempted, to recompute later): paused ones (they hold blocks and run nothing) and,
         where the policy allows it (`policy.may_preempt`), running ones.

Admission (step 2) may free memory the same way, from paused requests ranked below the
newcomer. With a policy that never displaces (FCFS) this schedules exactly as `Scheduler`.
"""
from __future__ import annotations

from bisect import insort

from .request import Request, Status
from .scheduler import Scheduler, SchedulerOutput


class PriorityScheduler(Scheduler):
    displaces = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_pauses = 0

    def schedule(self) -> SchedulerOutput:
        self.running.sort(key=self.policy.priority)
        displaced = SchedulerOutput()
        if self.policy.displaces:
            self._displace(displaced)
        out = super().schedule()  # steps 1 and 2 (their preemptions alone stop admission)
        out.preempted[:0] = displaced.preempted
        return out

    def _displace(self, out: SchedulerOutput) -> None:
        """Step 0: the best waiting request takes the lowest running one's seat (pausing it)
        and, if memory is short, blocks from residents it outranks; it joins the running set
        in rank order."""
        self.waiting.sort(key=self.policy.priority)
        while self.waiting and self.running and self.policy.may_displace(self.waiting[0], self.running[-1]):
            head = self.waiting[0]
            if len(self.running) >= self.max_num_seqs:
                self.pause(self.running[-1])  # appended to the queue: head stays first
            budget = self.max_num_batched_tokens  # (a window's blocks: for one step's tokens at most)
            if not self._is_resident(head) and not self._reclaim(head, out, True, budget):
                return
            self.waiting.pop(0)
            if not self._is_resident(head):
                head.num_computed_tokens = self.blocks.allocate(head.request_id, head.all_ids, budget)
            head.status = Status.RUNNING
            insort(self.running, head, key=self.policy.priority)

    def _fits(self, req: Request, out: SchedulerOutput, n: int = 0) -> bool:
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

    def pause(self, req: Request) -> None:
        """Take a running request out of the running set but leave it its blocks: it gave its
        seat to a request the policy ranks higher, and resumes where it stopped."""
        self.running.remove(req)
        req.status = Status.PAUSED
        self.num_pauses += 1
        self.waiting.append(req)
