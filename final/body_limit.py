"""Refuse a request body over the server's limit before anything parses it (413).

A declared Content-Length over the limit is refused without reading a byte; a body that
streams in without one (chunked) is refused as soon as it passes the limit. The body is
read here, then handed on whole, so the app never holds more than the limit.
"""
from __future__ import annotations

from .errors import error


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body, else 413 in OpenAI's shape."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self.refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left while sending: nobody to answer
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self.refuse(scope, receive, send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():  # the whole body once, then the real channel (to see a disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay, send)

    async def refuse(self, scope, receive, send):
        response = error(413, f"the request body is larger than this server's limit of {self.max_bytes} bytes "
                              "(--max-request-bytes)")
        await response(scope, receive, send)
