"""A scheduling simulator: stage 04's real scheduler and stage 03's real `BlockManager`, driven
by a discrete-event loop in which the forward pass is replaced by the cost model.

    clock = 0
    loop: admit the requests that have arrived by `clock`
          out = scheduler.schedule()                       (the real one, any policy)
          clock += cost.step_time(tokens, seqs, kv_tokens)  (instead of running the model)
          every request that caught up "samples" a token; the ones at their length finish

Everything but the model is the engine's own code, so the schedule is the engine's schedule:
`replay.py` runs the real engine on the same trace and clock and gets the same completion
times (a test checks it), while this loop does 10,000 requests in seconds. Output lengths come
from the trace (as `ignore_eos` would give them). Prompt token ids are synthetic and distinct
per request unless the trace carries real ones (then prefix-cache hits are real too).
"""
from __future__ import annotations

from dataclasses import dataclass

from course.s03_paged.block_manager import BlockManager
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.policy import SchedulingPolicy
from course.s04_continuous_batching.priority_scheduler import PriorityScheduler
from course.s04_continuous_batching.request import Request

from .cost_model import CostModel


@dataclass
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    prompt_ids: list[int] | None = None  # real token ids, when the trace has them


@dataclass
class Completion:
    """What happened to one request of the trace (times in seconds from the trace's start)."""
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    num_preemptions: int = 0
    finish_step: int = 0

    @property
    def jct_s(self) -> float:  # job completion time
        return self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


class SimSequence:
    """Just enough of stage 01's Sequence for the scheduler: ids, and when it arrived."""

    def __init__(self, prompt_ids: list[int], arrival_s: float):
        self.prompt_ids, self.output_ids, self.start_time = list(prompt_ids), [], arrival_s
        self.all_ids = list(prompt_ids)  # one growing buffer, as in the real one

    def append(self, token_id: int) -> None:
        self.output_ids.append(token_id)
        self.all_ids.append(token_id)


def synthetic_ids(index: int, count: int) -> list[int]:
    """Prompt token ids no other request has: no false prefix-cache hits between requests."""
    return [((index + 1) << 24) + j for j in range(count)]


@dataclass
class SimResult:
    completions: list[Completion]  # in trace order
    steps: int
    preemptions: int
    pauses: int
    makespan_s: float


def simulate(trace: list[TraceRequest], cost: CostModel, config: EngineConfig, policy: SchedulingPolicy) -> SimResult:
    blocks = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
    scheduler = PriorityScheduler(blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                  config.enable_chunked_prefill, policy)
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    first, done = {}, {}
    clock, steps, nxt = 0.0, 0, 0
    while nxt < len(order) or scheduler.waiting or scheduler.running:
        while nxt < len(order) and trace[order[nxt]].arrival_s <= clock:
            i = order[nxt]
            t = trace[i]
            ids = t.prompt_ids or synthetic_ids(i, t.prompt_tokens)
            scheduler.add(Request(i, SimSequence(ids, t.arrival_s), priority=t.priority))
            nxt += 1
        out = scheduler.schedule()
        if not out.chunks:
            if nxt == len(order):
                raise RuntimeError("the scheduler is stuck: requests wait but nothing can run")
            clock = max(clock, trace[order[nxt]].arrival_s)  # idle until the next arrival
            continue
        kv = sum(req.num_computed_tokens + n for req, n in out.chunks)
        clock += cost.step_time(out.num_batched_tokens, len(out.chunks), kv)
        steps += 1
        for req, n in out.chunks:
            req.num_computed_tokens += n
            seq = req.seq
            caught_up = req.num_computed_tokens == req.num_tokens
            blocks.commit(req.request_id, seq.all_ids, req.num_computed_tokens)
            if not caught_up:
                continue
            seq.append(0)  # any id: block hashes chain from the prompt, which is unique
            first.setdefault(req.request_id, clock)
            if len(seq.output_ids) == trace[req.request_id].output_tokens:
                scheduler.finish(req)
                done[req.request_id] = (clock, req.num_preemptions, steps - 1)
    completions = [Completion(t.arrival_s, first[i], done[i][0], t.prompt_tokens, t.output_tokens, done[i][1],
                              done[i][2]) for i, t in enumerate(trace)]
    return SimResult(completions, steps, scheduler.num_preemptions, scheduler.num_pauses, clock)
