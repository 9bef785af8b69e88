"""Scheduling policies: the scheduler's seam. The scheduler owns the mechanics (the token budget,
blocks, preemption); a policy only answers its questions:

  priority(r)             which request goes first (lower keys first)
  may_displace(w, r)      may waiting request w take running request r's seat now (r is paused)?
  may_preempt(w, r)       ... and, when memory is short, its blocks (r recomputes later)?
  choose_victim(...)      whom to preempt when memory is short
  on_add / on_step / on_finish
                          what it needs to remember: a stateful policy (final/'s MLFQ) counts
                          each request's attained service in on_step, once per step, with the
                          chunks the engine is about to run

FCFS answers "never" to displacement and keeps no state: scheduler.py's `Scheduler` is all it
needs. A policy that displaces (`displaces = True`: `Priority`, vLLM's priority policy; final/'s
MLFQ) runs on priority_scheduler.py's `PriorityScheduler`, which the engine picks for it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for type names: the scheduler imports this module
    from .request import Request
    from .scheduler import SchedulerOutput


class SchedulingPolicy(ABC):
    displaces = False  # True when may_displace can ever say yes (then it runs on PriorityScheduler)

    @abstractmethod
    def priority(self, request: Request) -> tuple:
        """The sort key: lower keys run first. Must be unique (end it with the request id)."""

    def may_displace(self, waiting: Request, running: Request) -> bool:
        """May `waiting` take `running`'s seat now? (`running` is paused: it keeps its blocks.)"""
        return False

    def may_preempt(self, waiting: Request, running: Request) -> bool:
        """May `waiting` take `running`'s blocks when memory is short? That costs `running` a
        recompute, so a policy may be stricter here than for seats. Default: as for seats."""
        return self.may_displace(waiting, running)

    def choose_victim(self, running: list[Request], paused: list[Request]) -> Request:
        """Whom to preempt when a block is missing. `running` is in priority order and its tail
        has not been scheduled yet this step; `paused` hold blocks but run nothing. Default: the
        lowest-ranked of them (a paused request when it ranks lowest, else the last running)."""
        return max(paused + running[-1:], key=self.priority)

    def on_add(self, request: Request) -> None:
        """A request arrived."""

    def on_step(self, out: SchedulerOutput) -> None:
        """The step that runs `out.chunks` was scheduled (the engine runs exactly these)."""

    def on_finish(self, request: Request) -> None:
        """A request finished or was aborted: forget it."""


class FCFS(SchedulingPolicy):
    """First come, first served. A preempted request keeps its place: it arrived early."""

    def priority(self, request: Request) -> tuple:
        return (request.arrival_time, request.request_id)


class Priority(SchedulingPolicy):
    """vLLM's priority scheduling: lower `request.priority` first, ties by arrival. A waiting
    request with a strictly better priority displaces the lowest running one when the running
    set is full or memory is short, and a preempted request keeps its priority (it lives on
    the request), so it comes back before lower-priority newcomers."""

    displaces = True

    def priority(self, request: Request) -> tuple:
        return (request.priority, request.arrival_time, request.request_id)

    def may_displace(self, waiting: Request, running: Request) -> bool:
        return waiting.priority < running.priority
