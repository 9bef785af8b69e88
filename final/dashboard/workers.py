"""The per-worker view of a disaggregated server: its engines run in stage 07's worker
processes, each serving its own snapshots (GET /state, GET /events); the front relays them.

    page ── /dashboard/events?worker=decode-0 ──> front ── GET /events ──> the decode worker
                                                        <── its SSE bytes, passed on as they come
    notebook ── /v1/engine/state ──> {"workers": {name: snapshot, ...}}   every worker's, at once
             ── /v1/engine/state?worker=NAME ──> that worker's snapshot

A relayed stream ends when the page leaves (the worker then sees its reader go and stops building
snapshots), when the worker's stream ends, or at shutdown. At most MAX_RELAYS are open at once.
"""
from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse

from ..errors import error

MAX_RELAYS = 32


def add_worker_routes(app: FastAPI, engine, keep_alive_s: float, event_headers: dict) -> None:
    """`engine.workers`: name -> URL of each worker (RemoteEngine)."""
    relays = 0
    timeout = httpx.Timeout(10.0, read=5 * keep_alive_s)  # a worker's stream writes every keep_alive_s

    def pick(worker: str | None) -> tuple[str, str] | Response:
        names = list(engine.workers)
        name = names[0] if worker is None else worker
        if name not in engine.workers:
            return error(404, f"no worker named {worker!r}; this server's workers: {', '.join(names)}")
        return name, engine.workers[name]

    async def worker_state(url: str) -> dict:
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                r = await http.get(url + "/state")
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, ValueError) as e:
            return {"error": f"the worker did not answer: {type(e).__name__}: {e}"}

    @app.get("/v1/engine/state")
    async def state(worker: str | None = None):
        if worker is None:  # every worker's, side by side
            names = list(engine.workers)
            snapshots = await asyncio.gather(*(worker_state(engine.workers[n]) for n in names))
            return {"workers": dict(zip(names, snapshots))}
        picked = pick(worker)
        if isinstance(picked, Response):
            return picked
        snapshot = await worker_state(picked[1])
        if "error" in snapshot:
            return error(502, f"worker {picked[0]}: {snapshot['error']}")
        return Response(json.dumps(snapshot, separators=(",", ":")), media_type="application/json")

    @app.get("/dashboard/events")
    async def events(worker: str | None = None):
        nonlocal relays
        picked = pick(worker)
        if isinstance(picked, Response):
            return picked
        if relays >= MAX_RELAYS:
            return error(429, f"{MAX_RELAYS} dashboards are open already; close one")
        name, url = picked
        http = httpx.AsyncClient(timeout=timeout)
        try:  # opened before answering, so the worker's refusal (429) or absence is the page's answer
            upstream = await http.send(http.build_request("GET", url + "/events"), stream=True)
        except httpx.HTTPError as e:
            await http.aclose()
            return error(502, f"worker {name} did not answer: {type(e).__name__}")
        if upstream.status_code != 200:
            body = await upstream.aread()
            await http.aclose()
            return Response(body, status_code=upstream.status_code, media_type="application/json")

        async def relay():
            nonlocal relays
            relays += 1
            try:
                async for chunk in upstream.aiter_raw():  # the worker writes a keep-alive every second
                    yield chunk
                    if not engine.accepting:  # a shutdown ends every stream
                        return
            except httpx.HTTPError:
                return  # the worker went away: the page reconnects
            finally:
                relays -= 1
                await http.aclose()  # closes the worker's stream too: it unsubscribes

        return StreamingResponse(relay(), media_type="text/event-stream", headers=event_headers)
