"""One snapshot of the engine, as plain JSON: the batch, the block pool, the queues, the figures.

Built on the engine thread (only it touches the engine's state), between two steps. Its size
is bounded whatever the load: at most MAX_ROWS batch rows and MAX_IDS ids per queue (the counts
are exact), and the pool as run-lengths of at most MAX_CELLS cells (a bigger pool is drawn with
several blocks per cell, each cell showing the most notable state among its blocks).
Blocks freed by a preemption since the last snapshot are listed beside the states.

    {"engine": {...sizes, policy}, "running": [rows], "num_running": N,
     "queues": {"waiting"|"paused"|"preempted": {"count": N, "ids": [...]}},
     "pool": {"num_blocks", "group", "cells", "states", "runs": [state, length, ...],
              "preempted_cells": [...], "counts"},
     "totals": {preemptions, pauses, refusals, ...}, "series": {one point of each time series}}

The series point covers the steps since the last snapshot; the step clock that feeds it runs
only while a page is open (step_clock.py), so a snapshot built on demand has no step figures.
"""
from __future__ import annotations

import itertools
import time

from course.s01_decode_loop.bench.measure import percentile
from course.s04_continuous_batching.request import Status

# block states, least to most notable (a cell of several blocks shows the largest)
STATES = ("free", "cached", "used", "shared")
FREE, CACHED, USED, SHARED = range(len(STATES))
MAX_CELLS, MAX_ROWS, MAX_IDS = 4096, 128, 32


def block_states(blocks) -> bytearray:
    """One state per block: free (empty), cached (free, but its K/V still name a prefix),
    used by one request, shared by several (prefix cache, forks)."""
    states = bytearray(blocks.num_blocks)
    for b in blocks.cached_free.values():
        states[b] = CACHED
    for table in blocks.tables.values():
        for b in table:
            states[b] = SHARED if blocks.blocks[b].ref_count > 1 else USED
    return states


def pool_json(states: bytearray, preempted: set[int] = frozenset(), max_cells: int = MAX_CELLS) -> dict:
    """The pool as run-lengths of cells, and the cells holding blocks a preemption freed since
    the last snapshot (drawn outlined over their state now: the next request may already use them)."""
    group = -(-len(states) // max_cells)
    cells = states if group == 1 else bytes(max(states[i:i + group]) for i in range(0, len(states), group))
    runs = []
    for state, run in itertools.groupby(cells):
        runs += [state, sum(1 for _ in run)]
    counts = {name: states.count(i) for i, name in enumerate(STATES)} | {"preempted": len(preempted)}
    return {"num_blocks": len(states), "group": group, "cells": len(cells), "states": list(STATES),
            "runs": runs, "preempted_cells": sorted({b // group for b in preempted}), "counts": counts}


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def row_json(engine, req, row) -> dict:
    policy = engine.scheduler.policy
    level = policy.level(req) if hasattr(policy, "level") else None  # MLFQ (scheduling/)
    return {"id": req.request_id, "kind": row.kind if row else "idle", "tokens": row.tokens if row else 0,
            "drafted": row.drafted if row else 0, "accepted": row.accepted if row else 0,
            "grammar": getattr(req, "grammar", None) is not None, "priority": req.priority, "level": level,
            "prompt_tokens": len(req.seq.prompt_ids), "output_tokens": len(req.seq.output_ids),
            "blocks": len(engine.blocks.tables.get(req.request_id, ()))}


def queues_json(waiting) -> dict:
    out = {}
    for name, status in (("waiting", Status.WAITING), ("paused", Status.PAUSED), ("preempted", Status.PREEMPTED)):
        ids = [r.request_id for r in waiting if r.status is status]
        out[name] = {"count": len(ids), "ids": ids[:MAX_IDS]}
    return out


def series_json(window, spec_delta: tuple[int, int] | None, kv_usage: float) -> dict:
    steps, elapsed = window.steps, max(time.perf_counter() - window.started, 1e-9)
    per_step = (lambda s: ms(s / steps)) if steps else (lambda s: None)
    proposed, accepted = spec_delta or (0, 0)
    return {"steps": steps, "step_ms": per_step(window.step_s),
            "phases_ms": {phase: per_step(s) for phase, s in window.phase_s.items()},
            "tokens_per_step": window.batched_tokens / steps if steps else None,
            "output_tok_s": window.emitted_tokens / elapsed,
            "ttft_p50_ms": ms(percentile(window.ttft_s, 50)), "ttft_p99_ms": ms(percentile(window.ttft_s, 99)),
            "tpot_p50_ms": ms(percentile(window.tpot_s, 50)), "tpot_p99_ms": ms(percentile(window.tpot_s, 99)),
            "kv_usage": kv_usage, "spec_acceptance": accepted / proposed if proposed else None}


def build_snapshot(engine, window, refusals: int = 0, spec_delta: tuple[int, int] | None = None) -> dict:
    """The engine as it stands between two steps, with `window`'s steps as the series point."""
    sched, blocks, config = engine.scheduler, engine.blocks, engine.config
    window.forget_gone(engine.requests)
    states = block_states(blocks)
    in_use = sum(1 for s in states if s in (USED, SHARED))
    spec = getattr(engine, "speculative", None)
    return {
        "time": time.time(),
        "engine": {"num_blocks": blocks.num_blocks, "block_size": blocks.block_size,
                   "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
                   "policy": type(sched.policy).__name__, "speculative": spec.method if spec else "none",
                   "max_waiting": config.max_waiting},
        "running": [row_json(engine, req, window.rows.get(req.request_id)) for req in sched.running[:MAX_ROWS]],
        "num_running": len(sched.running),
        "queues": queues_json(sched.waiting),
        "pool": pool_json(states, window.preempted_blocks),
        "preempted_now": window.preempted_ids[:MAX_IDS],
        "totals": {"preemptions": sched.num_preemptions, "pauses": sched.num_pauses, "refusals": refusals,
                   "prefix_hit_tokens": blocks.prefix_hit_tokens, "prompt_tokens": blocks.prompt_tokens},
        "series": series_json(window, spec_delta, in_use / max(1, blocks.num_blocks)),
    }
