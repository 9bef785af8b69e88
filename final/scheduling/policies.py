"""Skip-Join MLFQ (FastServe: Wu et al., arXiv 2305.05920), on stage 04's policy seam.

FCFS makes a short request wait behind long ones (head-of-line blocking). Shortest-first would
fix that, but nobody knows how long an answer will be. A multi-level feedback queue learns it:
every request starts high and sinks as it receives service, so the ones still running after a
lot of service (the long ones) yield to newcomers.

  levels      0 .. L-1, level i has a quantum of base * ratio**i seconds of service
              (the paper: 10 ms x 2**i on a GPU)
  skip-join   a newcomer joins the highest level whose quantum covers its estimated prefill
              time (from the cost model), not level 0: a long prompt would use up the small
              quanta in its first step anyway
  demotion    a request that used up its level's quantum moves one level down (its count
              starts again there)
  promotion   a request not served for `starvation_s` goes back to level 0, so long requests
              cannot starve under a stream of short ones
  order       by level, FCFS within a level; a waiting request of a higher level displaces
              the lowest running one (stage 04 pauses it: its KV stays); when memory is short,
              the lowest levels are preempted first

Service is counted with the cost model, never the wall clock: each step, every scheduled request
is charged the predicted time of its own new tokens run alone (recomputing what a preemption
took is not service), and the policy's clock advances by the predicted time of the whole step. The schedule is therefore a function of the requests alone:
tests assert on it, and the simulator reproduces it.

Preemption is recompute (stage 04's), not FastServe's swap to host memory: this engine runs on
the CPU, where the KV cache already lives in host RAM, so a swap would copy bytes from RAM to RAM
to free nothing scarce. (On a GPU, swapping trades PCIe time for recompute time.) Pausing, which
keeps the blocks, covers the common case of a request that only lost its seat.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from course.s04_continuous_batching.policy import FCFS, Priority, SchedulingPolicy
from course.s04_continuous_batching.request import Request
from course.s04_continuous_batching.scheduler import SchedulerOutput

from .cost_model import CostModel

POLICIES = ("fcfs", "priority", "mlfq")


@dataclass
class MLFQConfig:
    base_quantum_s: float | None = None  # None: one decode step of the cost model (the paper's 10 ms on a GPU)
    ratio: float = 2.0
    num_levels: int = 8
    starvation_s: float | None = None    # None: 100 x the lowest level's quantum (see the README: too short a
                                         # bound turns overload into churn)

    def __post_init__(self):
        if self.ratio <= 1 or self.num_levels < 1 or (self.base_quantum_s is not None and self.base_quantum_s <= 0):
            raise ValueError("MLFQ needs ratio > 1, at least one level and a positive base quantum")


@dataclass
class _Standing:
    level: int
    used_s: float = 0.0  # service received at this level
    high_water: int = 0  # tokens it ever had computed: recomputing them after a preemption is not service
    promoted: bool = False  # back at level 0 for starving, not served since: first in line, displaces no one


class SkipJoinMLFQ(SchedulingPolicy):
    displaces = True

    def __init__(self, cost: CostModel, config: MLFQConfig | None = None):
        self.cost, config = cost, config or MLFQConfig()
        base = config.base_quantum_s or cost.step_time(1, 1, 128)
        self.quanta = [base * config.ratio ** i for i in range(config.num_levels)]
        self.starvation_s = config.starvation_s or 100 * self.quanta[-1]
        self.standing: dict[int, _Standing] = {}
        self.last_served: OrderedDict[int, float] = OrderedDict()  # least recently served first
        self.clock = 0.0  # predicted seconds of engine steps so far
        self.demotions = self.promotions = 0

    def join_level(self, prompt_tokens: int) -> int:
        """Skip-join: the highest level whose quantum covers the prompt's predicted prefill."""
        prefill = self.cost.step_time(prompt_tokens, 1, prompt_tokens)
        return next((i for i, q in enumerate(self.quanta) if prefill <= q), len(self.quanta) - 1)

    def level(self, request: Request) -> int:
        return self.standing[request.request_id].level

    def priority(self, request: Request) -> tuple:
        return (self.standing[request.request_id].level, request.arrival_time, request.request_id)

    def may_displace(self, waiting: Request, running: Request) -> bool:
        """A higher level takes a lower one's seat; a promoted request only goes first in line:
        if it pushed others out, they would starve in turn, be promoted, push out others..."""
        s = self.standing[waiting.request_id]
        return s.level < self.level(running) and not s.promoted

    def may_preempt(self, waiting: Request, running: Request) -> bool:
        """Only a newcomer takes blocks from a running request (which then recomputes). A request
        that ran before and now ranks higher (it was promoted, or the other was demoted) waits
        for free blocks at the head of the queue instead: otherwise ranks that keep changing
        turn into preemptions that keep coming, each a recompute (measured: at 90% load on the
        CPU the engine then spent its time recomputing, 150 preemptions per request)."""
        return self.may_displace(waiting, running) and self.standing[waiting.request_id].high_water == 0

    def on_add(self, request: Request) -> None:
        self.standing[request.request_id] = _Standing(self.join_level(len(request.seq.prompt_ids)))
        self.last_served[request.request_id] = self.clock

    def on_step(self, out: SchedulerOutput) -> None:
        if not out.chunks:
            return
        kv = 0
        for req, n in out.chunks:
            context = req.num_computed_tokens + n
            kv += context
            s = self.standing[req.request_id]
            new = context - max(s.high_water, req.num_computed_tokens)
            if new > 0:  # what it recomputes after a preemption is not charged: it would sink while
                s.high_water = context  # catching up, then lose its KV again to the one it yields to
                self._charge(s, self.cost.step_time(new, 1, context))
        self.clock += self.cost.step_time(out.num_batched_tokens, len(out.chunks), kv)
        for req, _ in out.chunks:
            self.standing[req.request_id].promoted = False
            self.last_served[req.request_id] = self.clock
            self.last_served.move_to_end(req.request_id)
        self._promote_starved()

    def on_finish(self, request: Request) -> None:
        self.standing.pop(request.request_id, None)
        self.last_served.pop(request.request_id, None)

    def _charge(self, s: _Standing, seconds: float) -> None:
        s.used_s += seconds
        if s.used_s >= self.quanta[s.level] and s.level < len(self.quanta) - 1:
            s.level, s.used_s = s.level + 1, 0.0
            self.demotions += 1

    def _promote_starved(self) -> None:
        while self.last_served:
            rid, served = next(iter(self.last_served.items()))
            if self.clock - served <= self.starvation_s:
                return  # the rest were served more recently
            s = self.standing[rid]
            if s.level > 0:
                self.promotions += 1
            s.level, s.used_s, s.promoted = 0, 0.0, True
            self.last_served[rid] = self.clock  # the bound starts again
            self.last_served.move_to_end(rid)


def scheduling_policy(args) -> SchedulingPolicy:
    """The policy `python -m course.final serve`'s scheduling flags ask for."""
    from .cost_model import MEASURED_CPU, load
    if args.scheduling_policy != "mlfq":
        return make_policy(args.scheduling_policy)
    mlfq = MLFQConfig(args.mlfq_base_quantum, args.mlfq_ratio, args.mlfq_levels, args.mlfq_starvation)
    try:
        cost = load(args.cost_model or MEASURED_CPU)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--cost-model: cannot read {args.cost_model or MEASURED_CPU}: {e}") from None
    return SkipJoinMLFQ(cost, mlfq)


def make_policy(name: str, cost: CostModel | None = None, mlfq: MLFQConfig | None = None) -> SchedulingPolicy:
    """The policy a `--scheduling-policy` name stands for."""
    if name == "fcfs":
        return FCFS()
    if name == "priority":
        return Priority()
    if name == "mlfq":
        if cost is None:
            from .cost_model import load
            cost = load()
        return SkipJoinMLFQ(cost, mlfq)
    raise ValueError(f"unknown scheduling policy {name!r}; choose one of {list(POLICIES)}")
