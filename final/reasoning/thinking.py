"""The server's reasoning parser: which tags, whether a request's prompt opened the thinking, and
the end tag as the vocabulary writes it (stage 08's EndOfThinking, made once, on first use)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from course.s08_structured.reasoning import PARSERS, EndOfThinking, ThinkingTags, thinking_open

PARSER_CHOICES = ["auto", "none", *PARSERS]
PROMPT_TAIL = 32  # tokens of the rendered prompt read to tell whether it opened or closed the thinking


@dataclass
class RequestThinking:
    """What one request's answer needs: the tags, whether it starts inside the thinking, and the
    server's Thinking (for the end tag's tables)."""
    tags: ThinkingTags
    open: bool
    server: "Thinking"


def thinking_for(name: str, tokenizer, grammars) -> "Thinking | None":
    """The parser `name` asks for, None for none (or auto on a template without the tags); a
    ValueError naming both if the named parser does not fit this model."""
    template = tokenizer.chat_template
    template = template if isinstance(template, str) else str(template or "")  # a dict of named templates too
    if name == "none":
        return None
    tags = PARSERS["qwen3" if name == "auto" else name]
    in_template = tags.start in template and tags.end in template
    if name == "auto":
        return Thinking(tags, tokenizer, grammars) if in_template else None
    if not in_template and tags.end not in tokenizer.get_vocab():
        raise ValueError(f"--reasoning-parser {name} reads {tags.start}...{tags.end}, but this model's chat template "
                         f"never writes {tags.end} and its vocabulary has no such token; use --reasoning-parser none "
                         "(or a --chat-template that thinks)")
    return Thinking(tags, tokenizer, grammars)


class Thinking:
    def __init__(self, tags: ThinkingTags, tokenizer, grammars):
        self.tags, self.tokenizer, self.grammars = tags, tokenizer, grammars
        self._end: EndOfThinking | None = None
        self._lock = threading.Lock()

    def end_of_thinking(self) -> EndOfThinking:
        """Built on first use (a pass over the vocabulary), on the thread that asks."""
        with self._lock:
            if self._end is None:
                ids = self.tokenizer(self.tags.end, add_special_tokens=False).input_ids
                self._end = EndOfThinking(self.grammars.tokenizer_info(), self.tags.end, ids)
            return self._end

    def prepare(self, body, ids: list[int], max_tokens: int, max_len: int) -> tuple[list[int], int]:
        """Read where the rendered prompt leaves the thinking, and set it on `body`. A request that
        must count or constrain after the thinking, to a model that opens the thinking itself, gets
        the start tag at the end of its prompt: then the thinking surely comes first and the
        answer's grammar knows where it starts. Returns the prompt ids and max_tokens to use."""
        tail = self.tokenizer.decode(ids[-PROMPT_TAIL:])
        is_open = thinking_open(tail, self.tags)
        closed_by_template = tail.rstrip().endswith(self.tags.end)   # e.g. enable_thinking: false
        if not is_open and not closed_by_template and body.waits_for_thinking():
            ids = ids + self.tokenizer(self.tags.start + "\n", add_special_tokens=False).input_ids
            is_open = True
            if body.max_tokens is None and body.max_completion_tokens is None:
                max_tokens = max(1, min(max_tokens, max_len - len(ids)))
        body.set_thinking(RequestThinking(self.tags, is_open, self))
        return ids, max_tokens
