"""Chat's answer as Responses output items, and the typed events that stream them.

`Output` reads chat deltas (`reasoning`, `content`, `tool_calls`) and opens an item for each
kind as it begins: a reasoning item, a message, a function call per call. Each item is
announced (`response.output_item.added`, its content part), written in deltas, and closed
(`.done` events) when the next one begins or the answer ends. A whole chat answer is read as
one delta, so streamed and whole answers give the same items.
"""
from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
DELTA = {"message": "response.output_text.delta", "reasoning": "response.reasoning_text.delta",
         "function_call": "response.function_call_arguments.delta"}
PART = {"message": "output_text", "reasoning": "reasoning_text"}


@dataclass
class Item:
    kind: str                # message, reasoning or function_call
    index: int               # its place in the response's output
    text: str = ""           # the message's or reasoning's text, or the call's arguments
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"

    def __post_init__(self):
        self.id = f"{PREFIX[self.kind]}_{uuid.uuid4().hex[:24]}"

    def part(self) -> dict:
        extra = {"annotations": [], "logprobs": []} if self.kind == "message" else {}
        return {"type": PART[self.kind], "text": self.text} | extra

    def json(self) -> dict:
        if self.kind == "function_call":
            return {"type": "function_call", "id": self.id, "call_id": self.call_id, "name": self.name,
                    "arguments": self.text, "status": self.status}
        content = [self.part()] if self.status != "in_progress" else []
        if self.kind == "reasoning":
            return {"type": "reasoning", "id": self.id, "summary": [], "content": content, "status": self.status}
        return {"type": "message", "id": self.id, "role": "assistant", "status": self.status, "content": content}


class Output:
    """The items of one answer, and the events that build them (without sequence numbers)."""

    def __init__(self):
        self.items: list[Item] = []
        self.calls: dict[int, Item] = {}   # chat's tool-call index -> its item
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def delta(self, delta: dict) -> list[dict]:
        events = []
        if delta.get("reasoning"):
            events += self._write("reasoning", delta["reasoning"])
        if delta.get("content"):
            events += self._write("message", delta["content"])
        for position, call in enumerate(delta.get("tool_calls") or []):
            index = call.get("index", position)  # a whole answer's calls have no index
            if call.get("id"):   # a call's first delta names it
                events += self._open("function_call", call_id=call["id"], name=call["function"]["name"])
                self.calls[index] = self.items[-1]
            if call["function"].get("arguments"):
                events += self._write_to(self.calls[index], call["function"]["arguments"])
        return events

    def finish(self, reason: str | None) -> list[dict]:
        """Close the last item (an empty message if nothing was written)."""
        self.finish_reason = reason
        events = [] if self.items else self._open("message")
        return events + self._close()

    def whole(self, answer: dict) -> None:
        """A whole chat answer (its first choice)."""
        choice = answer["choices"][0]
        self.delta(choice["message"])
        self.finish(choice["finish_reason"])
        self.usage = answer.get("usage")

    def chat_message(self) -> dict:
        """The answer as a chat turn, for a follow-up's prompt (reasoning left out)."""
        text = "".join(i.text for i in self.items if i.kind == "message")
        calls = [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.text}}
                 for i in self.items if i.kind == "function_call"]
        message = {"role": "assistant", "content": text or (None if calls else "")}
        return message | ({"tool_calls": calls} if calls else {})

    def _write(self, kind: str, text: str) -> list[dict]:
        events = [] if self.items and self.items[-1].kind == kind else self._open(kind)
        return events + self._write_to(self.items[-1], text)

    def _write_to(self, item: Item, text: str) -> list[dict]:
        item.text += text
        event = {"type": DELTA[item.kind], "item_id": item.id, "output_index": item.index, "delta": text}
        return [event | ({} if item.kind == "function_call" else {"content_index": 0})
                | ({"logprobs": []} if item.kind == "message" else {})]

    def _open(self, kind: str, **fields) -> list[dict]:
        events = self._close()
        item = Item(kind, len(self.items), **fields)
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": item.index, "item": item.json()})
        if kind != "function_call":
            events.append({"type": "response.content_part.added", "item_id": item.id, "output_index": item.index,
                           "content_index": 0, "part": item.part()})
        return events

    def _close(self) -> list[dict]:
        if not self.items or self.items[-1].status != "in_progress":
            return []
        item = self.items[-1]
        item.status = "incomplete" if self.finish_reason == "length" else "completed"  # cut by max_output_tokens
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            events = [{"type": "response.function_call_arguments.done", **where, "arguments": item.text}]
        else:
            kind = "output_text" if item.kind == "message" else "reasoning_text"
            events = [{"type": f"response.{kind}.done", **where, "content_index": 0, "text": item.text}
                      | ({"logprobs": []} if item.kind == "message" else {}),
                      {"type": "response.content_part.done", **where, "content_index": 0, "part": item.part()}]
        return events + [{"type": "response.output_item.done", "output_index": item.index, "item": item.json()}]


def sse(event: dict, sequence: itertools.count) -> str:
    event = event | {"sequence_number": next(sequence)}
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def stream_events(chat, output: Output, response, on_end):
    """Responses' events for chat's stream `chat` (a StreamingResponse of `data: {...}` chunks).
    `response(status)`: the response object so far; `on_end()`: the whole one, once the answer ends.
    However it ends, chat's stream is closed, which frees the engine request."""
    sequence = itertools.count()
    yield sse({"type": "response.created", "response": response("in_progress")}, sequence)
    yield sse({"type": "response.in_progress", "response": response("in_progress")}, sequence)
    try:
        async for chunk in chat.body_iterator:
            data = chunk.removeprefix("data: ").strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:  # the engine failed the request after the headers went out
                failed = response("failed") | {"error": {"code": "server_error", "message": chunk["error"]["message"]}}
                yield sse({"type": "response.failed", "response": failed}, sequence)
                return
            output.usage = chunk.get("usage") or output.usage
            for choice in chunk["choices"]:
                events = output.delta(choice["delta"])
                events += output.finish(choice["finish_reason"]) if choice["finish_reason"] else []
                for event in events:
                    yield sse(event, sequence)
        whole = on_end()
        yield sse({"type": f"response.{whole['status']}", "response": whole}, sequence)
    finally:
        await chat.body_iterator.aclose()
        if chat.background:
            await chat.background()
