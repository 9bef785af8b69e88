"""The dashboard's routes, plugged into the server (`plug_in`) unless it runs with --no-dashboard.

    GET /dashboard          the page (static/dashboard.html, plain JS: no build step)
    GET /dashboard/workers  {"workers": [names]}: a disaggregated server's worker engines, [] for one engine
    GET /dashboard/events   server-sent events, one JSON snapshot each, while the page is open
    GET /v1/engine/state    the latest snapshot as JSON: one under a second old as it is, else one
                            built on demand (so polling costs the engine one snapshot a second at most)

The snapshots are stage 04's (course.s04_continuous_batching.watch). A disaggregated server
(`serve --disaggregated`, `--replicas`) runs no engine of its own: `?worker=NAME` picks the
worker whose snapshots the two data routes relay (workers.py).

With --api-key (security/) the data routes need `Authorization: Bearer KEY`; the page and its
script do not (no data in them): the page asks for the key and sends it with each read.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI, Response
from fastapi.responses import FileResponse, StreamingResponse

from course.s04_continuous_batching.watch import EngineWatch, may_join, snapshot_events

from ..errors import error
from .workers import add_worker_routes

STATIC = Path(__file__).parent / "static"
KEEP_ALIVE_S = 1.0  # an idle stream sends a comment this often, so a gone client is noticed
EVENT_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def plug_in(app: FastAPI, server) -> None:
    """The dashboard on the server's engine (a build_app plug-in). An engine thread of this process
    gets stage 04's watch after each loop turn (`after_turn`: it builds nothing while no page is
    open); a disaggregated server relays its workers' snapshots instead."""
    engine = server.engine
    if not engine.workers:
        engine.watch = watch = EngineWatch()
        engine.after_turn.append(lambda llm: watch.turn(llm, engine.refused))
    add_dashboard_routes(app, engine)


def add_dashboard_routes(app: FastAPI, engine) -> None:
    """`engine`: an EngineClient with a `watch` (EngineWatch) and `call(fn)` on its engine thread,
    or one with `workers` (name -> URL), whose own /state and /events are relayed."""

    @app.get("/dashboard")
    async def page():
        return FileResponse(STATIC / "dashboard.html", headers={"cache-control": "no-cache"})

    @app.get("/dashboard/dashboard.js")
    async def script():
        return FileResponse(STATIC / "dashboard.js", media_type="text/javascript", headers={"cache-control": "no-cache"})

    @app.get("/dashboard/workers")
    async def workers():
        return {"workers": list(engine.workers)}

    if engine.workers:
        add_worker_routes(app, engine, KEEP_ALIVE_S, EVENT_HEADERS)
        return
    watch: EngineWatch = engine.watch

    @app.get("/v1/engine/state")
    async def state(worker: str | None = None):
        if worker is not None:
            return error(404, "this server runs one engine: it has no workers to pick from")
        data = watch.recent()
        if data is None:
            if not engine.accepting:
                return error(503, "the server is shutting down")
            data = await asyncio.get_running_loop().run_in_executor(
                None, engine.call, lambda e: watch.build_json(e, engine.refused))
        return Response(data, media_type="application/json")

    @app.get("/dashboard/events")
    async def events(worker: str | None = None):
        if worker is not None:
            return error(404, "this server runs one engine: it has no workers to pick from")
        if not may_join(watch):
            return error(429, f"{watch.max_watchers} dashboards are open already; close one")
        return StreamingResponse(snapshot_events(watch, lambda: engine.accepting, KEEP_ALIVE_S),  # a shutdown ends it
                                 media_type="text/event-stream", headers=EVENT_HEADERS)
