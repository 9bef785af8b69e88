"""The dashboard's three routes, added to the server unless it runs with --no-dashboard.

    GET /dashboard          the page (static/dashboard.html, plain JS: no build step)
    GET /dashboard/events   server-sent events, one JSON snapshot each, while the page is open
    GET /v1/engine/state    the latest snapshot as JSON: one under a second old as it is, else one
                            built on demand (so polling costs the engine one snapshot a second at most)

With --api-key (security/) the state and the stream need `Authorization: Bearer KEY`; the page and
its script do not (no data in them): the page asks for the key and sends it with each read.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI, Response
from fastapi.responses import FileResponse, StreamingResponse

from ..errors import error
from .watch import EngineWatch, TooManyWatchersError

STATIC = Path(__file__).parent / "static"
KEEP_ALIVE_S = 1.0  # an idle stream sends a comment this often, so a gone client is noticed


def add_dashboard_routes(app: FastAPI, engine) -> None:
    """`engine`: an EngineClient with a `watch` (EngineWatch) and `call(fn)` on its engine thread."""
    watch: EngineWatch = engine.watch

    @app.get("/dashboard")
    async def page():
        return FileResponse(STATIC / "dashboard.html", headers={"cache-control": "no-cache"})

    @app.get("/dashboard/dashboard.js")
    async def script():
        return FileResponse(STATIC / "dashboard.js", media_type="text/javascript", headers={"cache-control": "no-cache"})

    @app.get("/v1/engine/state")
    async def state():
        data = watch.recent()
        if data is None:
            if not engine.accepting:
                return error(503, "the server is shutting down")
            data = await asyncio.get_running_loop().run_in_executor(
                None, engine.call, lambda e: watch.build_json(e, engine.refused))
        return Response(data, media_type="application/json")

    @app.get("/dashboard/events")
    async def events():
        if watch.watching >= watch.max_watchers:
            return error(429, f"{watch.max_watchers} dashboards are open already; close one")

        async def stream():
            try:  # subscribed inside the stream, so whatever ends it (the client leaving too) unsubscribes
                watcher = watch.subscribe(asyncio.get_running_loop())
            except TooManyWatchersError:
                return
            try:
                while engine.accepting:  # a shutdown ends every stream
                    try:
                        data = await asyncio.wait_for(watcher.queue.get(), KEEP_ALIVE_S)
                    except asyncio.TimeoutError:
                        yield ": idle\n\n"
                        continue
                    yield f"data: {data}\n\n"
            finally:
                watch.unsubscribe(watcher)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
