"""An OpenAI-compatible HTTP server over the engine thread (FastAPI + SSE).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics (Prometheus). `response_format` (json_object / json_schema) holds every choice to
the schema with stage 08's token masks (structured.py).

No request can hurt another. Everything a request could fail on is checked for that request,
before it reaches the shared engine step, and answered in OpenAI's error shape (errors.py):
400 for bad or unsupported input (a prompt too long for the context, a schema past the
compile limits), 413 for a body over --max-request-bytes, 429 when the queue is full (decided
on the event loop, no engine step waited for), 503 while shutting down, 500 only for an
engine failure. Tokenizing, chat templating and schema compiling run off the event loop, and
a client that goes away stops its request wherever it is (disconnect.py).

The server knows its engine only as an EngineClient (engine_client.py): the same routes serve
the engine thread in this process (async_engine.py) or stage 07's workers (disaggregated/).

Plug-ins. `build_app` serves this lesson alone; the rooms join through `plugins`, functions
`plug_in(app, server)` called before the routes are added (cli.py lists them). A plug-in may mix
its fields into the request bodies (`server.chat_body`, `server.completion_body`, with
protocol.py's `with_fields`), add routes or a middleware to `app`, take over a step of
answering (`server.complete`, `server.answer_chat`), or give the grammar cache its JSON-schema
compiler (`server.grammars`).
"""
import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask

from course.s04_continuous_batching.engine import QueueFullError

from .body_limit import BodyLimit
from .disconnect import until_disconnected
from .engine_client import EngineClient, GenerationRequest, ShuttingDownError
from .errors import error, install_error_handlers
from .protocol import IGNORED_HEADER, ChatRequest, CompletionRequest, StreamOptions
from .responses import Choice, sse
from .structured import GrammarCache, warning_headers


@dataclass
class ServerLimits:
    """What one request may cost the server (the CLI sets them; the defaults suit a laptop)."""
    max_request_bytes: int = 2 * 2**20   # larger bodies get 413 before they are parsed
    grammar_timeout_s: float = 20.0      # a response_format schema that compiles longer gets 400


def status_of(exc: BaseException) -> int:
    """The HTTP status for an exception raised while serving a request."""
    if isinstance(exc, QueueFullError):
        return 429
    if isinstance(exc, ShuttingDownError):
        return 503
    if isinstance(exc, ValueError):  # bad input: context, KV pool, sampling values, schema limits
        return 400
    return 500


class Server:
    """What the routes share, and the steps of answering: the engine, the tokenizer and its
    thread, the grammar cache, the request bodies. A plug-in may replace a body or a step."""

    def __init__(self, engine: EngineClient, tokenizer, model_name: str, limits: ServerLimits):
        self.engine, self.tokenizer, self.model_name, self.limits = engine, tokenizer, model_name, limits
        self.max_len = engine.limits.max_model_len
        self.grammars = GrammarCache(tokenizer, engine.limits.vocab_size, list(engine.limits.eos_token_ids),
                                     timeout_s=limits.grammar_timeout_s)
        self.chat_body, self.completion_body = ChatRequest, CompletionRequest
        # One thread tokenizes and renders chat templates, so a long prompt never stalls the event
        # loop (the Rust tokenizer releases the GIL); one thread is enough and keeps it thread-safe.
        self.text_pool = ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
        # A prompt longer than this many characters cannot fit in the context, whatever it says:
        # no token is longer than the longest vocabulary entry (x2 for normalizers). Refused
        # before tokenizing, so a megabyte prompt costs nothing.
        self.max_chars = 2 * max(map(len, tokenizer.get_vocab())) * self.max_len

    def check_length(self, chars: int) -> None:
        if chars > self.max_chars:
            raise ValueError(f"the prompt has {chars} characters, more than this model's maximum context "
                             f"length of {self.max_len} tokens can hold; please shorten it")

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.text_pool, fn, *args)

    def chat_ids(self, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None = None) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=True, **(template_kwargs or {}))
        return self.tokenizer(rendered, add_special_tokens=False).input_ids

    async def complete(self, body) -> Response:
        """A completion of one text prompt (harness/ takes this step over: token ids, several
        prompts, echo)."""
        self.engine.check_room(body.n)  # a full queue answers 429 before any tokenizing
        self.check_length(len(body.prompt))
        ids = await self.off_loop(lambda: self.tokenizer(body.prompt).input_ids)
        return await self.respond(body, ids, body.max_tokens, "text_completion")

    async def chat(self, body) -> Response:
        self.engine.check_room(body.n)
        messages, tools = body.chat_prompt(self.tokenizer)  # each turn's role and text (and tools/' tools)
        self.check_length(sum(len(m["content"]) for m in messages) + len(str(tools or "")))
        try:
            ids = await self.off_loop(self.chat_ids, messages, tools, body.template_kwargs())
        except TemplateError as e:  # the model's template refuses these messages
            raise ValueError(f"the chat template refused these messages: {e}") from e
        max_tokens = body.max_completion_tokens or body.max_tokens or max(1, self.max_len - len(ids))
        return await self.answer_chat(body, ids, max_tokens)

    async def answer_chat(self, body, ids: list[int], max_tokens: int) -> Response:
        """A chat answer for the rendered prompt (harness/ takes this step over: prompt_logprobs)."""
        return await self.respond(body, ids, max_tokens, "chat.completion")

    async def respond(self, body, ids: list[int], max_tokens: int, kind: str):
        """One prompt's answer: the request checked and submitted, its choices streamed or gathered."""
        max_len = self.max_len
        if len(ids) + max_tokens > max_len:
            return error(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                              f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                              "completion). Please reduce the prompt or max_tokens.")
        rid = f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        constrained = body.uses_grammar()  # a response_format's (or tool calls') grammar
        request = GenerationRequest(ids, body.sampling_params(max_tokens),  # ValueError for bad sampling values
                                    priority=body.priority, speculative=body.speculative, request_id=rid,
                                    constrained=constrained)
        if constrained and body.ignore_eos:
            return error(400, "ignore_eos cannot be combined with response_format: once the JSON is complete "
                              "only the end of the output may follow")
        body.check_vocabulary(self.engine.limits.vocab_size)  # FieldError: logit_bias names no such token
        if why := self.engine.refuse(request):  # an option this engine cannot honour: named, never ignored,
            return error(400, why)              # and before any schema is compiled for it
        # 400s past its limits; max_tokens: the JSON is closed before it runs out
        request.grammars = await body.grammars(self.grammars, request.n, max_tokens)
        headers = warning_headers(request.grammars)  # what a best-effort schema compile did not enforce
        if ignored := body.ignored_fields():  # accepted as OpenAI's API does, but with no effect here
            headers[IGNORED_HEADER] = ", ".join(ignored)
        stream = self.engine.submit(request)  # admission: raises at once
        shape = body.response_shape()(kind, request.request_id, int(time.time()), self.model_name, len(ids),
                                      self.tokenizer)
        if body.stream:
            return StreamingResponse(sse(shape, stream, body.stream_options or StreamOptions(), status_of),
                                     media_type="text/event-stream", background=BackgroundTask(stream.close),
                                     headers=headers)
        choices = [Choice() for _ in request.params]
        try:
            async for index, event in stream:
                choices[index].add(event)
        except Exception as e:  # noqa: BLE001 - the engine failed this request (500) or shut down (503)
            return error(status_of(e), str(e))
        finally:
            stream.close()  # also when cancelled because the client left: frees the KV blocks
        return JSONResponse(shape.whole(choices), headers=headers) if headers else shape.whole(choices)


async def answer(work) -> Response:
    """The route's response, or its failure as an OpenAI error with the right status."""
    try:
        return await work
    except (ValueError, QueueFullError, ShuttingDownError) as e:
        return error(status_of(e), str(e), param=getattr(e, "param", None))


def build_app(engine: EngineClient, tokenizer, model_name: str, limits: ServerLimits | None = None,
              plugins: Iterable[Callable[[FastAPI, Server], None]] = ()) -> FastAPI:
    """The app over `engine`, with each of `plugins` called on it and its Server before the
    routes are added (so the routes take the bodies the plug-ins made)."""
    app = FastAPI(title="course.final")
    app.add_middleware(BodyLimit, max_bytes=(limits or ServerLimits()).max_request_bytes)
    install_error_handlers(app)
    server = Server(engine, tokenizer, model_name, limits or ServerLimits())
    app.state.grammars = server.grammars  # the shutdown cancels its compiles
    for plug_in in plugins:
        plug_in(app, server)
    ChatBody, CompletionBody = server.chat_body, server.completion_body

    @app.get("/health")
    async def health():
        return {"status": "ok"} if engine.accepting else error(503, "the server is shutting down")

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "course",
                                            "max_model_len": server.max_len,
                                            "architecture": engine.limits.architecture}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        return await until_disconnected(request, answer(server.complete(body)))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request):
        return await until_disconnected(request, answer(server.chat(body)))

    return app
