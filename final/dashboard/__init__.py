"""A live view of the engine: the batch, the KV block pool and the queues, a few times a second.

    browser ──GET /dashboard──────────> static/dashboard.html + dashboard.js (canvas, no build step)
            <──GET /dashboard/events── SSE: one JSON snapshot per update (routes.py)
    notebook ─GET /v1/engine/state───> the latest snapshot, or one built on demand

    engine thread, end of each loop turn: EngineWatch.turn (watch.py)
        nobody watching ─> nothing (no clock on the step, no snapshot)
        a page open     ─> StepClock times the step's phases (step_clock.py); at most ~5 times a
                           second build_snapshot (snapshot.py) reads the scheduler and block pool

Read in this order: snapshot.py (what a snapshot holds), step_clock.py (what each step adds
while someone watches), watch.py (when snapshots are built and who gets them), routes.py, then
static/dashboard.js. `python -m course.final serve --no-dashboard` leaves the routes out (404).
"""
