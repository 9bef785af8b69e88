"""The watch on an HTTP app: GET /state and GET /events for one engine (a stage 07 worker's).

    GET /state    the latest snapshot as JSON: one under a second old as it is (a reader keeps them
                  coming), else one built on demand on the engine thread
    GET /events   the snapshots as server-sent events while the client reads (429 when every
                  reader slot is taken)

The app's owner passes `on_engine`, which runs a function of the engine on the engine's thread
and is awaited for its result, and `alive`, which turns false when the server stops (the
streams end then). Whoever runs the engine must also call `watch.turn(engine)` after each of its
turns, or no snapshot ever comes.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response, StreamingResponse

from .engine_watch import EngineWatch, may_join, snapshot_events


def add_watch_routes(app: FastAPI, watch: EngineWatch, on_engine: Callable[[Callable], Awaitable],
                     alive: Callable[[], bool]) -> None:
    @app.get("/state")
    async def state():
        data = watch.recent() or await on_engine(watch.build_json)
        return Response(data, media_type="application/json")

    @app.get("/events")
    async def events():
        if not may_join(watch):
            raise HTTPException(429, f"{watch.max_watchers} readers already")
        return StreamingResponse(snapshot_events(watch, alive), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
