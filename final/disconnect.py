"""Stop work the moment its client hangs up.

Starlette cancels a streaming response when its client disconnects, but a plain route keeps
running after the client is gone: a non-streamed completion would decode to `max_tokens` for
nobody, holding its KV blocks, and a streamed request still waiting in the queue would run its
prefill. `until_disconnected` runs the route's work beside a watcher of the connection and
cancels the work (whose cleanup aborts the engine request) when the client leaves first.
"""
from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request, Response

CLIENT_CLOSED = 499  # nginx's status for "client closed request"; nobody is left to read it


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client has disconnected. The body has been read by now, so the server's
    `receive` blocks until the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work) -> Response:
    """Await the coroutine `work`; if the client disconnects first, cancel it."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():  # the client left first (or this route was cancelled): stop the work
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return Response(status_code=CLIENT_CLOSED)
    return task.result()
