"""A key at the door: `Authorization: Bearer KEY` on every route but /health (and /metrics, unless
the operator puts it behind the key too) and the dashboard's page, which asks for the key itself.

    client ──> ApiKeyCheck ──> BodyLimit ──> FastAPI routes
                  │ no key, a wrong key, a malformed header
                  └─> 401 {"error": {"type": "invalid_request_error", "code": "invalid_api_key", ...}}

An ASGI middleware, outermost: a refused request is answered before its body is read. Every
path needs the key except the open ones, so a route added later, a 404 or a path spelled
differently ("//v1/models") never answers a stranger. The key is compared in constant time:
both sides are hashed first (SHA-256) and compared with `hmac.compare_digest`, so neither the
length nor the first differing byte of a key shows in the response time; every key is tried,
whichever matches.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

MISSING = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
           "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
WRONG = "Incorrect API key provided."


# The dashboard's page and script hold no data: a browser must load them to ask for the key,
# which the page then sends with every read of the engine's state (dashboard/).
PUBLIC_PAGES = frozenset({"/dashboard", "/dashboard/dashboard.js"})


@dataclass(frozen=True)
class Door:
    """Who may come in, and how the server listens (the CLI fills it: options.py)."""
    keys: tuple[str, ...] = ()          # none: the door is open
    metrics_need_key: bool = False      # /metrics behind the key too
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None

    def open_paths(self) -> frozenset[str]:
        return PUBLIC_PAGES | frozenset({"/health"} if self.metrics_need_key else {"/health", "/metrics"})


def digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def refusal(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "invalid_api_key"}}).encode()


class ApiKeyCheck:
    def __init__(self, app, door: Door):
        self.app, self.open_paths = app, door.open_paths()
        self.digests = [digest(k.encode()) for k in door.keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            problem = self.check(scope["headers"])
            if problem:
                return await self.refuse(send, problem)
        await self.app(scope, receive, send)

    def check(self, headers) -> str | None:
        """Why the request may not come in, or None."""
        values = [v for k, v in headers if k == b"authorization"]
        if not values:
            return MISSING
        scheme, _, token = values[0].strip().partition(b" ")
        if len(values) > 1 or scheme.lower() != b"bearer" or not token.strip():
            return WRONG
        given, ok = digest(token.strip()), False
        for key in self.digests:  # no early exit: every key costs the same
            ok |= hmac.compare_digest(given, key)
        return None if ok else WRONG

    @staticmethod
    async def refuse(send, message: str) -> None:
        body = refusal(message)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def protect(app, door: Door | None) -> None:
    """Put the key check in front of everything `app` serves (when `door` has keys)."""
    app.state.door = door = door or Door()
    if door.keys:
        app.add_middleware(ApiKeyCheck, door=door)


def guard(door: Door | None):
    """A build_app plug-in that puts `door` in front of everything the app serves. Plug it in last:
    the middleware added last is the outermost, so a refused request is answered before any other."""
    return lambda app, server: protect(app, door)
