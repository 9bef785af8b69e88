"""Exercise: the scheduler's two hard rules, the token budget and preemption. Fill in the two
bodies below, then run

    pytest stages/04_continuous_batching --exercise

`--exercise` (root conftest.py) puts these methods onto the reference `Scheduler` in
`course.s04_continuous_batching.scheduler`, in that module's namespace: `self` has every other
method and field (`self.blocks`, the stage 03 BlockManager; `self.running`; `self.policy`;
`self.enable_chunked_prefill`; `self.max_num_batched_tokens`; `self.preempt`, `self._paused`).
Without the flag the tests run the reference. Read `scheduler.py`'s docstrings first; its code is
the answer, so try before you look.
"""
from __future__ import annotations

from course.s04_continuous_batching.request import Request
from course.s04_continuous_batching.scheduler import SchedulerOutput


class Scheduler:
    def _tokens_for(self, req: Request, budget: int) -> int:
        """How many of `req`'s uncomputed tokens (`req.num_uncomputed`) run this step, given
        `budget` tokens left. With chunked prefill: as many as fit. Without it: all or none (a
        prompt runs whole or waits) -- except a request needing more than any step can hold
        (`max_num_batched_tokens`), which must be chunked anyway or it would wait forever."""
        raise NotImplementedError("exercise: stages/04_continuous_batching/exercises/scheduler.py _tokens_for")

    def _make_room(self, req: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Make sure `req` has blocks for `num_tokens` tokens in all. While it needs more new
        blocks (`self.blocks.blocks_needed(num_tokens)` minus the blocks in its table) than are
        free, preempt the victim the policy chooses (`self.policy.choose_victim(self.running,
        self._paused())`, `self.preempt(victim)`) and record it in `out.preempted`; if the victim
        is `req` itself, return False. Then reserve the slots (`self.blocks.append_slot`) and
        return True."""
        raise NotImplementedError("exercise: stages/04_continuous_batching/exercises/scheduler.py _make_room")
