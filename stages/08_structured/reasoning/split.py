"""The thinking and the answer, told apart.

Reasoning models (Qwen3, DeepSeek-R1 and their descendants) think before they answer, between
two tags:

    <think>
    The user wants a city. Paris is the capital...
    </think>

    {"city": "Paris"}

A server hands the two parts back separately (vLLM's `message.reasoning`, `message.content`), so a
client shows the answer alone and a program parses it alone. Where the thinking *starts* differs
between templates: DeepSeek-R1's template writes `<think>` at the end of the prompt, so the output
begins inside the thinking; Qwen3's leaves it to the model, which opens with `<think>` (and with
`enable_thinking: false` the template writes an empty `<think></think>` into the prompt, so
there is none). Reading the rendered prompt settles it (`thinking_open`), so one rule serves both:

    thinking open at the start, or the output begins with the start tag:
        reasoning = everything up to the end tag; content = what follows it, less the whitespace
        between (no end tag: the output was cut while thinking, and all of it is reasoning)
    otherwise: no reasoning, all content

`ReasoningStream` applies the same rule a piece at a time, holding back only a tail that might
still become a tag, so the streamed parts always join to `split_reasoning`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..tools.lazy import pending_prefix


@dataclass(frozen=True)
class ThinkingTags:
    start: str = "<think>"
    end: str = "</think>"


# vLLM's --reasoning-parser names. Both families write the same tags; the prompt says where the
# thinking starts, so they need no different rules.
PARSERS = {"qwen3": ThinkingTags(), "deepseek_r1": ThinkingTags()}


def thinking_open(prompt_text: str, tags: ThinkingTags) -> bool:
    """Whether the rendered prompt ends inside a thinking block (its last start tag is not closed)."""
    start = prompt_text.rfind(tags.start)
    return start >= 0 and start > prompt_text.rfind(tags.end)


def split_reasoning(text: str, tags: ThinkingTags, open_at_start: bool) -> tuple[str | None, str]:
    """(reasoning, or None if the output did not think; content) of a whole output."""
    if not open_at_start:
        if not text.startswith(tags.start):
            return None, text
        text = text[len(tags.start):]
    reasoning, end, rest = text.partition(tags.end)
    return reasoning, rest.lstrip() if end else ""


class ReasoningStream:
    """`split_reasoning`, fed a piece at a time: each `feed` returns the (reasoning, content) it
    settled; `finish` hands back what was held."""

    def __init__(self, tags: ThinkingTags, open_at_start: bool):
        self.tags, self.held = tags, ""
        self.state = "reasoning" if open_at_start else "start"   # start, reasoning, gap, content
        self.thought = open_at_start  # whether there is a reasoning part at all

    def feed(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                start = self.tags.start
                if self.held.startswith(start):
                    self.held, self.state, self.thought = self.held[len(start):], "reasoning", True
                elif start.startswith(self.held):
                    return reasoning, content   # maybe the start tag: wait
                else:
                    self.state = "content"
            elif self.state == "reasoning":
                before, end, after = self.held.partition(self.tags.end)
                if not end:
                    keep = pending_prefix(self.held, self.tags.end)
                    reasoning += self.held[:len(self.held) - keep]
                    self.held = self.held[len(self.held) - keep:]
                    return reasoning, content
                reasoning, self.held, self.state = reasoning + before, after, "gap"
            elif self.state == "gap":
                self.held = self.held.lstrip()
                if not self.held:
                    return reasoning, content
                self.state = "content"
            else:
                content, self.held = content + self.held, ""
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The held tail: reasoning if the output stopped while thinking, else content."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held, ""
        return "", held if self.state in ("start", "content") else ""
