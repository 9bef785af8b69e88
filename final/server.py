"""An OpenAI-compatible HTTP server over the engine thread (FastAPI + SSE).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics (Prometheus). `response_format` (json_object / json_schema) holds every choice to
the schema with stage 08's token masks (structured.py).
Errors come in OpenAI's shape {"error": {"message", "type", "code"}} with the right status:
400 for bad or unsupported input (including a prompt too long for the context), 429 when the
queue is full, 500 only for an engine failure, and that for the one request alone.
"""
from __future__ import annotations

import itertools
import json
import time
import uuid

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from course.s02_kv_cache.kv_cache import CacheCapacityError
from course.s04_continuous_batching.engine import QueueFullError

from .async_engine import AsyncEngine, EngineDeadError
from .protocol import ChatRequest, CompletionRequest, StreamOptions
from .structured import GrammarCache


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(error_body(status, message, kind), status_code=status)


def build_app(engine: AsyncEngine, tokenizer, model_name: str) -> FastAPI:
    app = FastAPI(title="course.final")
    max_len = engine.engine.max_model_len
    grammars = GrammarCache(tokenizer, engine.engine.model.config.vocab_size, engine.engine.eos_token_ids)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return error(400, problems or "malformed request body")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "course",
                                            "max_model_len": max_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        ids = tokenizer(body.prompt).input_ids
        return await respond(body, ids, body.max_tokens, "text_completion")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(rendered, add_special_tokens=False).input_ids
        max_tokens = body.max_completion_tokens or body.max_tokens or max(1, max_len - len(ids))
        return await respond(body, ids, max_tokens, "chat.completion")

    async def respond(body, ids: list[int], max_tokens: int, kind: str):
        if len(ids) + max_tokens > max_len:
            return error(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                              f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                              "completion). Please reduce the prompt or max_tokens.")
        try:
            params = body.sampling_params(max_tokens)
            processors = await grammars.processors(body.response_format, len(params))
        except ValueError as e:   # bad sampling values; a malformed or unsupported schema
            return error(400, str(e))
        if processors:
            if body.ignore_eos:
                return error(400, "ignore_eos cannot be combined with response_format: once the JSON "
                                  "is complete only the end of the output may follow")
            for p, processor in zip(params, processors):
                p.logits_processors = [processor]
        stream = engine.generate_many(ids, params)
        try:
            first = await anext(stream)  # admission errors surface here, before any byte is sent
        except CacheCapacityError as e:  # too long for the context or the whole KV pool
            return error(400, str(e))
        except QueueFullError as e:
            return error(429, str(e), "rate_limit_error")
        except EngineDeadError as e:
            return error(500, str(e), "internal_error")
        rid, created = f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        shape = Shape(kind, rid, created, model_name, len(ids), tokenizer)
        if body.stream:
            options = body.stream_options or StreamOptions()
            return StreamingResponse(sse(shape, first, stream, options), media_type="text/event-stream")
        choices = [Choice() for _ in params]
        try:
            choices[first[0]].add(first[1])
            async for index, event in stream:
                choices[index].add(event)
        except EngineDeadError as e:
            return error(500, str(e), "internal_error")
        return shape.whole(choices)

    return app


class Choice:
    """One choice's text, token count and logprob entries, gathered from its token events."""

    def __init__(self):
        self.text, self.num_tokens, self.finish_reason, self.events = "", 0, None, []

    def add(self, event) -> None:
        self.text += event.text
        self.num_tokens += 1
        self.finish_reason = event.finish_reason
        if event.logprob is not None:
            self.events.append(event)


class Shape:
    """The JSON of OpenAI responses and stream chunks, for completions and chat alike."""

    def __init__(self, kind, rid, created, model, prompt_tokens, tokenizer):
        self.kind, self.rid, self.created, self.model, self.prompt_tokens = kind, rid, created, model, prompt_tokens
        self.chat, self.tokenizer = kind.startswith("chat"), tokenizer

    def usage(self, n: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    def choice(self, index: int, text: str, finish, events, text_offset: int, delta: bool) -> dict:
        logprobs = self.logprobs(events, text_offset) if events else None
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        key = "delta" if delta else "message"
        return {"index": index, key: {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish}

    def logprobs(self, events, text_offset: int) -> dict:
        """Completions: parallel lists (tokens, token_logprobs, top_logprobs, text_offset).
        Chat: a list of {token, logprob, bytes, top_logprobs}. Tokens are shown as their text."""
        token = lambda i: self.tokenizer.decode([i])  # noqa: E731
        if self.chat:
            def entry(i: int, lp: float) -> dict:
                text = token(i)
                return {"token": text, "logprob": lp, "bytes": list(text.encode())}
            return {"content": [entry(e.token_id, e.logprob) | {"top_logprobs": [entry(i, lp) for i, lp in e.top_logprobs]}
                                for e in events]}
        tokens = [token(e.token_id) for e in events]
        offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=text_offset))
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in events],
                "top_logprobs": [{token(i): lp for i, lp in e.top_logprobs} for e in events], "text_offset": offsets}

    def whole(self, choices: list[Choice]) -> dict:
        return {"id": self.rid, "object": self.kind, "created": self.created, "model": self.model,
                "choices": [self.choice(i, c.text, c.finish_reason, c.events, 0, delta=False)
                            for i, c in enumerate(choices)],
                "usage": self.usage(sum(c.num_tokens for c in choices))}

    def chunk(self, index=0, text="", finish=None, events=None, text_offset=0, usage=None, final=False) -> str:
        """A token's chunk (with `usage` so far if asked), or with final=True the usage-only last one."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body = {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [] if final else [self.choice(index, text, finish, events, text_offset, delta=True)]}
        if usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"


async def sse(shape: Shape, first, stream, options: StreamOptions):
    """One SSE event per token, flushed as it comes; a client that disconnects cancels this
    generator, which closes `stream`, which aborts the request and frees its blocks."""
    n, emitted = 0, {}  # tokens sent; per choice, the length of its tokens' text (logprobs' text_offset)

    def chunk(index, event) -> str:
        nonlocal n
        n += 1
        usage = shape.usage(n) if options.continuous_usage_stats else None
        if event.logprob is None:
            return shape.chunk(index, event.text, event.finish_reason, usage=usage)
        offset = emitted.get(index, 0)
        emitted[index] = offset + len(shape.tokenizer.decode([event.token_id]))
        return shape.chunk(index, event.text, event.finish_reason, [event], offset, usage=usage)

    try:
        yield chunk(*first)
        async for index, event in stream:
            yield chunk(index, event)
    except EngineDeadError as e:
        yield f"data: {json.dumps(error_body(500, str(e), 'internal_error'))}\n\n"
    finally:
        await stream.aclose()
    if options.include_usage:
        yield shape.chunk(usage=shape.usage(n), final=True)
    yield "data: [DONE]\n\n"
