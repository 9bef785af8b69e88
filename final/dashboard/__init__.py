"""A live view of the engine: the batch, the KV block pool and the queues, a few times a second.

    browser ──GET /dashboard──────────> static/dashboard.html + dashboard.js (canvas, no build step)
            <──GET /dashboard/events── SSE: one JSON snapshot per update (routes.py)
    notebook ─GET /v1/engine/state───> the latest snapshot, or one built on demand

    engine thread, end of each loop turn: EngineWatch.turn (stage 04's watch/, one of the
                                         AsyncEngine's `after_turn` hooks: routes.py's plug_in)
        nobody watching ─> nothing (no clock on the step, no snapshot)
        a page open     ─> the step clock times the step's phases; at most ~5 times a second a
                           snapshot reads the scheduler and block pool

A disaggregated server has no engine of its own: its workers serve their snapshots and
workers.py relays the one the page picks (`?worker=decode-0`).

Read stage 04's watch/ first (what a snapshot holds, when one is built), then routes.py,
workers.py and static/dashboard.js. `python -m course.final serve --no-dashboard` leaves the
routes out (404).
"""
from .routes import plug_in  # noqa: F401  (the server's plug-in: the watch and the routes)
