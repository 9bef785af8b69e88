"""OpenAI's Responses API, the one agents speak (the openai client's `responses.create`, the
OpenAI Agents SDK), served through the chat route: no second engine path.

    POST   /v1/responses        input items -> the server's chat body (translate.py) -> server.chat
                                -> output items (events.py), whole or streamed as typed events
    GET    /v1/responses/{id}   a stored response (store.py)
    DELETE /v1/responses/{id}

A request is checked twice: as a Responses body (protocol.py: unknown fields, unsupported item
and tool types, `background: true` are refused by name), then as the chat body it becomes, so
every chat rule (context length, tools, schemas) holds here too, its refusals named in
Responses' terms. A response stored (`store`, the default) keeps its conversation, so a request
with `previous_response_id` continues it; the store keeps the --responses-store-size most
recently used and says so when an id it let go is asked for.

`plug_in` adds the routes (a build_app plug-in; cli.py lists it).
"""
from __future__ import annotations

import json
import time
import uuid

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ..disconnect import until_disconnected
from ..errors import error
from ..protocol import IGNORED_HEADER
from ..server import answer
from . import translate
from .events import Output, stream_events
from .protocol import ResponsesRequest
from .store import STORE_SIZE, ResponseStore


def add_args(parser) -> None:
    parser.add_argument("--responses-store-size", type=int, default=STORE_SIZE, metavar="N",
                        help="/v1/responses keeps the N most recently used responses for previous_response_id "
                             "and GET (final/responses_api/)")


def plug_in(app, server, store_size: int = STORE_SIZE) -> None:
    store = ResponseStore(store_size)

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request):
        return await until_disconnected(request, answer(respond(server, store, body)))

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        stored = store.get(response_id)
        return stored.response if stored else error(404, store.why_missing(response_id), param="response_id")

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        if not store.delete(response_id):
            return error(404, store.why_missing(response_id), param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}


async def respond(server, store: ResponseStore, body: ResponsesRequest) -> Response:
    previous = store.get(body.previous_response_id) if body.previous_response_id else None
    if body.previous_response_id and previous is None:
        return error(404, store.why_missing(body.previous_response_id), param="previous_response_id")
    messages = (previous.conversation if previous else []) + translate.conversation(body.input)
    try:
        chat_body = server.chat_body.model_validate(translate.chat_request(body, messages))
    except ValidationError as e:
        raise translate.field_error(e) from None  # a 400 naming the field (server.answer)
    chat = await server.chat(chat_body)
    if isinstance(chat, Response) and chat.status_code >= 400:
        return chat  # in OpenAI's error shape already
    rid, created, output = f"resp_{uuid.uuid4().hex}", int(time.time()), Output()

    def snapshot(status: str | None = None) -> dict:
        return translate.response_object(body, rid, created, server.model_name, output, status)

    def finished() -> dict:
        response = snapshot()
        if body.store:
            store.put(response, messages + [output.chat_message()])
        return response

    # chat's headers (structured-output warnings), and the fields that changed nothing
    headers = {k: v for k, v in chat.headers.items() if k.startswith("x-")} if isinstance(chat, Response) else {}
    chat_ignored = [translate.RESPONSES_NAME.get(f, f) for f in headers.pop(IGNORED_HEADER, "").split(", ") if f]
    if ignored := list(dict.fromkeys(body.ignored_fields() + chat_ignored)):
        headers[IGNORED_HEADER] = ", ".join(ignored)
    if body.stream:  # chat's own closing task too, should this stream never start
        return StreamingResponse(stream_events(chat, output, snapshot, finished), media_type="text/event-stream",
                                 headers=headers, background=chat.background)
    output.whole(chat if isinstance(chat, dict) else json.loads(chat.body))
    return JSONResponse(finished(), headers=headers)
