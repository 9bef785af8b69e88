"""Watching the engine work: snapshots of the batch, the KV block pool and the queues.

    engine thread, end of each loop turn: EngineWatch.turn(engine)  (engine_watch.py)
        nobody watching ─> nothing (no clock on the step, no snapshot)
        someone watching ─> StepClock times the step's phases (step_clock.py); a few times a
                            second build_snapshot (snapshot.py) reads the scheduler and the pool
    a reader (a page, a notebook) ─> snapshot_events: the snapshots as server-sent events
                                     (may_join: is a reader slot free; read_snapshots: the
                                     client's side, the stream's lines back to snapshots)
    an HTTP app ─> add_watch_routes (routes.py): GET /state and /events for one engine

It needs only this stage's engine: the final server's /dashboard draws these snapshots, stage
07's workers serve them per worker, and a notebook can build one between two steps.
Read in this order: snapshot.py, step_clock.py, engine_watch.py, routes.py. Beside them,
recorder.py's StepRecorder keeps the pool's state after every step of a run (the notebook's pictures).
"""
from .engine_watch import EngineWatch, TooManyWatchersError, may_join, read_snapshots, snapshot_events
from .snapshot import build_snapshot
from .step_clock import StepClock

__all__ = ["EngineWatch", "StepClock", "TooManyWatchersError", "build_snapshot", "may_join", "read_snapshots",
           "snapshot_events"]
