"""Responses and stream chunks with `tool_calls`, as OpenAI sends them.

Whole: `message.tool_calls` (each with an id `call_...`, `type: function`, the function's name and
its arguments as a JSON string), `content` null unless text came before the first call, and
`finish_reason: "tool_calls"` when the answer ended with calls. Streamed: each call's first delta
carries its index, id, type and name; its arguments follow in pieces under the same index.
"""
from __future__ import annotations

from ..responses import Shape
from .parse import ToolCallParser, parse_whole


class ToolShape(Shape):
    def __init__(self, *args):
        super().__init__(*args)
        self.parsers: dict[int, ToolCallParser] = {}  # per streamed choice

    def choice(self, index, text, finish, events, text_offset, delta, first=True) -> dict:
        out = super().choice(index, text, finish, events, text_offset, delta, first)
        message = out["delta" if delta else "message"]
        if delta:
            parser = self.parsers.setdefault(index, ToolCallParser())
            content, calls = parser.feed(text)
            content += parser.finish() if finish else ""
            message["content"] = content if content or not calls else None
            if calls:
                message["tool_calls"] = calls
            made_calls = bool(parser.calls)
        else:
            message["content"], calls = parse_whole(text)
            if calls:
                message["tool_calls"] = calls
            made_calls = bool(calls)
        if finish == "stop" and made_calls:
            out["finish_reason"] = "tool_calls"
        return out

