"""Tagged text back into `tool_calls`, as it streams.

The grammar (stage 08's tools/calls.py) spells every call the same way,

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

so a small state machine reads it a piece at a time: text before the first `<tool_call>` is
content (minus a tail that might be the start of the tag, held back until it is decided; text
after a call is dropped); then the name (a call's first delta: its index, id and name); then the
arguments, sent on as they come; they end at the first `}` outside any string and any nesting,
the call's own brace.
`finish()` hands back what was held. The same parser reads a whole answer at once.
"""
from __future__ import annotations

import re
import uuid

from course.s08_structured.tools import CLOSE, OPEN, pending_prefix

HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')


class ToolCallParser:
    def __init__(self):
        self.state, self.buffer, self.calls = "text", "", []   # calls: {"id", "name", "arguments"}
        self.depth, self.in_string, self.escaped = 0, False, False

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content, tool-call deltas in OpenAI's stream shape) that `text` completes."""
        self.buffer += text
        content, deltas = "", []
        while True:
            if self.state == "text":
                at = self.buffer.find(OPEN)
                if at < 0:
                    keep = pending_prefix(self.buffer, OPEN)  # maybe the tag's start
                    content += self.buffer[:len(self.buffer) - keep] if not self.calls else ""
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    return content, deltas
                content += self.buffer[:at] if not self.calls else ""  # text between calls is dropped
                self.buffer, self.state = self.buffer[at + len(OPEN):], "head"
            elif self.state == "head":
                head = HEAD.match(self.buffer)
                if head is None or head.end() == len(self.buffer):
                    return content, deltas  # the name, or the space after it, may still grow
                call = {"id": f"call_{uuid.uuid4().hex[:24]}", "name": head.group(1), "arguments": ""}
                deltas.append({"index": len(self.calls), "id": call["id"], "type": "function",
                               "function": {"name": call["name"], "arguments": ""}})
                self.calls.append(call)
                self.buffer, self.state = self.buffer[head.end():], "arguments"
                self.depth, self.in_string, self.escaped = 0, False, False
            else:  # arguments
                end = self._scan()
                piece = self.buffer[:len(self.buffer) if end is None else end]
                if piece:
                    self.calls[-1]["arguments"] += piece
                    deltas.append({"index": len(self.calls) - 1, "function": {"arguments": piece}})
                if end is None:
                    self.buffer = ""
                    return content, deltas
                self.buffer, self.state = self.buffer[end + 1:].removeprefix(CLOSE), "text"

    def _scan(self) -> int | None:
        """Where the call's own closing brace is in the buffer (None: not yet), JSON-aware."""
        for i, ch in enumerate(self.buffer):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                if self.depth == 0:
                    return i
                self.depth -= 1
        return None

    def finish(self) -> str:
        """The content held back (a tail that turned out not to be a tag)."""
        held, self.buffer = (self.buffer if self.state == "text" and not self.calls else ""), ""
        return held


def parse_whole(text: str) -> tuple[str | None, list[dict]]:
    """(content or None, calls in OpenAI's message shape) of a whole answer."""
    parser = ToolCallParser()
    content, _ = parser.feed(text)
    content += parser.finish()
    calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in parser.calls]
    return (content or None) if calls else content, calls
