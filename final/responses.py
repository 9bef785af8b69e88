"""The JSON of OpenAI responses: whole answers, and stream chunks sent as server-sent events."""
from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from .engine_client import EventStream
from .errors import error_body

if TYPE_CHECKING:  # protocol.py's bodies name their Shape
    from .protocol import StreamOptions


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

    def choice(self, index: int, text: str, finish, events, text_offset: int, delta: bool,
               first: bool = True) -> dict:
        """A choice; in a chat stream the role comes with each choice's first chunk only, as
        OpenAI and vLLM send it."""
        logprobs = self.logprobs(events, text_offset) if events else None
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        message = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": index, "delta" if delta else "message": message, "logprobs": logprobs,
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

    def chunk(self, index=0, text="", finish=None, events=None, text_offset=0, usage=None, final=False,
              first=True) -> str:
        """A token's chunk (with `usage` so far if asked), or with final=True the usage-only last one."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body = {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [] if final else [self.choice(index, text, finish, events, text_offset, True, first)]}
        if usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"


async def sse(shape: Shape, stream: EventStream, options: StreamOptions, status_of):
    """One SSE event per token, flushed as it comes. A failure after the headers went out is
    sent as an error event in OpenAI's shape (`status_of(exc)` gives its status). A client that
    disconnects cancels this generator; closing `stream` aborts the request and frees its blocks."""
    n, emitted = 0, {}  # tokens sent; per choice, the length of its tokens' text (logprobs' text_offset)

    def chunk(index, event) -> str:
        nonlocal n
        n += 1
        usage = shape.usage(n) if options.continuous_usage_stats else None
        first = index not in emitted
        offset = emitted.get(index, 0)
        emitted[index] = offset + (len(shape.tokenizer.decode([event.token_id])) if event.logprob is not None else 0)
        events = [event] if event.logprob is not None else None
        return shape.chunk(index, event.text, event.finish_reason, events, offset, usage=usage, first=first)

    try:
        async for index, event in stream:
            yield chunk(index, event)
    except Exception as e:  # noqa: BLE001 - whatever ended the request, the client hears why
        yield f"data: {json.dumps(error_body(status_of(e), str(e)))}\n\n"
    finally:
        stream.close()
    if options.include_usage:
        yield shape.chunk(usage=shape.usage(n), final=True)
    yield "data: [DONE]\n\n"
