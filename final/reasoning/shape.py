"""Answers and stream chunks with the thinking split out, on top of any other shape (tools/'
ToolShape reads only the answer part for its calls).

    whole     message.reasoning (None if the model did not think), message.content: the answer
    streamed  delta.reasoning while thinking, delta.content after the end tag

`reasoning_content` carries the same text under the name older clients read.
"""
from __future__ import annotations

from course.s08_structured.reasoning import ReasoningStream, ThinkingTags, split_reasoning


def reasoning_shape(base: type, tags: ThinkingTags, open_at_start: bool) -> type:
    class ReasoningShape(base):
        def __init__(self, *args):
            super().__init__(*args)
            self.streams: dict[int, ReasoningStream] = {}  # per streamed choice

        def choice(self, index, text, finish, events, text_offset, delta, first=True) -> dict:
            if delta:
                stream = self.streams.setdefault(index, ReasoningStream(tags, open_at_start))
                reasoning, content = stream.feed(text)
                if finish:
                    held = stream.finish()
                    reasoning, content = reasoning + held[0], content + held[1]
            else:
                reasoning, content = split_reasoning(text, tags, open_at_start)
            out = super().choice(index, content, finish, events, text_offset, delta, first)
            message = out["delta" if delta else "message"]
            if reasoning or not delta:
                message["reasoning"] = message["reasoning_content"] = reasoning
            return out
    return ReasoningShape
