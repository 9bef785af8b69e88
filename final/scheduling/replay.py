"""Run a trace through the real engine, for comparison with the simulator (simulator.py).

Two clocks:
  "virtual"  requests arrive when the cost model's clock (the predicted time of the steps run so
             far) passes their arrival time, exactly as in the simulator: the real engine must
             then produce the simulator's schedule, so completion times agree exactly. This is
             what the test checks: real forwards, real sampling, real blocks, no wall time.
  "wall"     requests arrive at their wall-clock times and finish when they finish: how far the
             simulator's predictions are from this machine (bench_scheduling.py reports it).
"""
from __future__ import annotations

import time

from course.s01_decode_loop.sampling import SamplingParams

from .cost_model import CostModel
from .simulator import Completion, TraceRequest, synthetic_ids


def replay(engine, trace: list[TraceRequest], clock: str = "virtual", cost: CostModel | None = None,
           vocab_size: int | None = None) -> list[Completion]:
    """Completions in trace order. Prompts are the trace's ids, else synthetic ids folded into
    `vocab_size`; every request is greedy with `ignore_eos`, so it runs to its output length."""
    if clock not in ("virtual", "wall") or (clock == "virtual" and cost is None):
        raise ValueError("clock is 'virtual' (with a cost model) or 'wall'")
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    rid_to_index, first, done = {}, {}, {}
    start, now, nxt = time.perf_counter(), 0.0, 0

    def elapsed() -> float:
        return now if clock == "virtual" else time.perf_counter() - start

    while nxt < len(order) or engine.has_unfinished():
        while nxt < len(order) and trace[order[nxt]].arrival_s <= elapsed():
            i = order[nxt]
            t = trace[i]
            ids = t.prompt_ids or [x % vocab_size for x in synthetic_ids(i, t.prompt_tokens)]
            params = SamplingParams(max_new_tokens=t.output_tokens, temperature=0, ignore_eos=True)
            rid_to_index[engine.add_request(ids, params, t.priority)] = i
            nxt += 1
        steps = len(engine.step_log)  # the engine records what each step ran (record_steps)
        outputs = engine.step()
        if len(engine.step_log) == steps:  # nothing was schedulable
            if nxt == len(order):
                raise RuntimeError("the engine is stuck: requests wait but nothing can run")
            arrival = trace[order[nxt]].arrival_s  # idle until the next arrival
            if clock == "virtual":
                now = max(now, arrival)
            else:
                time.sleep(max(arrival - elapsed(), 0.0))
            continue
        chunks, step = engine.step_log[-1]["chunks"], steps
        if clock == "virtual":
            now += cost.step_time(sum(n for _, n, _ in chunks), len(chunks), sum(s + n for _, n, s in chunks))
        for out in outputs:
            i = rid_to_index[out.request_id]
            first.setdefault(i, elapsed())
            if out.event is not None and out.event.finish_reason:
                req = engine.requests[out.request_id]
                done[i] = (elapsed(), req.num_preemptions, step)
    return [Completion(t.arrival_s, first[i], done[i][0], t.prompt_tokens, t.output_tokens, done[i][1], done[i][2])
            for i, t in enumerate(trace)]
