"""Every error the server sends, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}
(`param`: the request field at fault, when there is one).

Whatever goes wrong, and wherever (FastAPI's body parsing, pydantic's validation, a route, an
unexpected bug), the client gets this shape with a 4xx for its own mistakes, a 5xx only for
ours. Messages may quote the client's input, so they are made safe to serialise first: a lone
surrogate (invalid in UTF-8) would otherwise turn a 400 into a crash while sending it.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("course.final")

KINDS = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error",
         503: "service_unavailable"}
MAX_MESSAGE_CHARS = 2000  # a message quoting a giant input stays readable


def safe_text(text: str) -> str:
    """`text` with lone surrogates escaped (so it encodes as UTF-8), shortened if huge."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "... (truncated)"


def error_body(status: int, message: str, kind: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": safe_text(message), "type": kind or KINDS.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error(status: int, message: str, kind: str | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, param), status_code=status)


class FieldError(ValueError):
    """A request field the server cannot honour: a 400 naming it in `param`."""

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(message)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(_, exc: RequestValidationError):
        where = [".".join(str(x) for x in e["loc"][1:]) for e in exc.errors()]
        problems = "; ".join(f"{w}: {e['msg']}" for w, e in zip(where, exc.errors()))
        return error(400, problems or "malformed request body", param=next((w for w in where if w), None))

    @app.exception_handler(HTTPException)  # FastAPI's own: unreadable body, 404, 405
    async def http_error(_, exc: HTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)  # a bug of ours: log it, answer 500 in the same shape
    async def unexpected(_, exc: Exception):
        log.exception("unhandled error")
        return error(500, f"internal error: {type(exc).__name__}")
