"""A grammar that starts where the thinking ends.

A reasoning model asked for JSON (or a tool call) must think freely first: masking the thinking
would forbid the words it thinks in, and masking nothing would let the answer go wrong. So the
grammar waits for the end tag, as tools/lazy.py's grammar waits for `<tool_call>`:

    "<think>The user wants a city...</think>\n\n{"city": "Paris"}"
     |--- free: (almost) never masked ---|    |-- the grammar --|

While the thinking runs before a grammar, three things are masked, each so the answer that
follows is whole:
  * a token that would close the tag and carry more than whitespace past it (">{" after
    "</think"): the answer's first byte is then always one the grammar reads itself;
  * the stop token: an output that ends while thinking has no answer to parse;
  * everything but the tag's next token once the thinking must end: after `budget` thinking
    tokens (vLLM's `thinking_token_budget`), or when the tokens left are only what the tag and
    the shortest valid answer need (so the answer never runs out of room).
With no grammar (a budget alone) only the budget's tag is forced.

A speculating engine asks `valid_prefix` for a draft that may hold the end tag anywhere: the
tokens up to the tag are judged by the rules above, the ones after it by the grammar, which is
made afresh at the tag (`fresh`: it knows how many tokens the answer has left there).
"""
from __future__ import annotations

import torch

from ..generate import GrammarLogitsProcessor
from ..serving.closing import planner_for
from ..tools.lazy import LazyGrammarLogitsProcessor, pending_prefix
from ..vocab import TokenizerInfo


class EndOfThinking:
    """The end tag as a vocabulary writes it: for each k (how many of the tag's first bytes the
    thinking ends with), the tokens that would complete it with more than whitespace after it;
    and the tag's own token ids (what a spent budget forces). Made once per vocabulary."""

    def __init__(self, info: TokenizerInfo, tag: str, tag_ids: list[int]):
        self.tag, self.tag_ids, self.token_bytes = tag.encode(), list(tag_ids), info.token_bytes
        self.stop_ids = frozenset(info.stop_ids)
        t = self.tag
        self.spills = [frozenset(i for i, b in enumerate(info.token_bytes)
                                 if (at := (t[:k] + b).find(t)) >= 0 and (t[:k] + b)[at + len(t):].strip())
                       for k in range(len(t))]

    def advance(self, k: int, token: int) -> tuple[int, bool]:
        """After `token`, with the output ending in the tag's first k bytes: (the new k, closed?)."""
        joined = self.tag[:k] + self.token_bytes[token]
        if self.tag in joined:
            return 0, True
        return pending_prefix(joined, self.tag), False


def fresh(grammar, max_new_tokens: int | None):
    """A new processor for `grammar`'s compiled grammar, at its start, with `max_new_tokens` left."""
    if isinstance(grammar, LazyGrammarLogitsProcessor):
        return LazyGrammarLogitsProcessor(grammar.compiled, grammar.triggers, max_new_tokens=max_new_tokens,
                                          narrow=grammar.narrow)
    return GrammarLogitsProcessor(grammar.compiled, max_new_tokens=max_new_tokens, narrow=grammar.narrow)


def answer_reserve(processor) -> int:
    """Tokens the shortest answer a grammar processor allows needs, its stop token included
    (a lazy grammar may stop at once)."""
    if isinstance(processor, GrammarLogitsProcessor):
        compiled = processor.compiled
        return int(planner_for(compiled).token_distance(compiled.pda.start_state())) + 1
    return 1


class ThinkingGate:
    """Free thinking, then `grammar` (a GrammarLogitsProcessor, a lazy one, or None for a
    thinking budget alone) from the token after the end tag. The output starts inside the
    thinking (the prompt opened it). One per request; follows any output, rolled back or not."""

    def __init__(self, end: EndOfThinking, grammar=None, *, budget: int | None = None,
                 max_new_tokens: int | None = None):
        self.end, self.grammar, self.max_new_tokens = end, grammar, max_new_tokens
        # the index of the first token the thinking may not choose freely any more
        limits = [budget] if budget is not None else []
        if grammar is not None and max_new_tokens is not None:
            limits.append(max_new_tokens - len(end.tag_ids) - answer_reserve(grammar))
        self.must_close_at = max(0, min(limits)) if limits else None
        self.ids: list[int] = []      # the output followed so far
        self.pending: list[int] = []  # after each of them: how many of the tag's bytes it ends with
        self.closed_at: int | None = None   # the index of the token that closed the thinking
        self.inner = None                   # the grammar, from the token after it

    @property
    def compiled(self):
        return None if self.grammar is None else self.grammar.compiled

    @property
    def finish_reason(self) -> str | None:
        return getattr(self.inner, "finish_reason", None)

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self._catch_up(output_ids)
        if self.closed_at is not None:
            return logits if self.inner is None else self.inner(output_ids[self.closed_at + 1:], logits)
        forced = self._forced(len(output_ids))
        if forced is not None:
            out = torch.full_like(logits, float("-inf"))
            out[..., forced] = logits[..., forced]
            return out
        banned = self._banned()
        if not banned:
            return logits
        logits = logits.clone()
        logits[..., sorted(i for i in banned if i < logits.shape[-1])] = float("-inf")
        return logits

    def prepare(self, output_ids: list[int]) -> None:
        self._catch_up(output_ids)
        if self.inner is not None:
            self.inner.prepare(output_ids[self.closed_at + 1:])

    def valid_prefix(self, output_ids: list[int], drafts: list[int]) -> int:
        """How many of `drafts` the thinking's rules, then the grammar, allow in a row."""
        self._catch_up(output_ids)
        n = 0
        while n < len(drafts):
            if self.closed_at is not None:
                if self.inner is not None:
                    n += self.inner.valid_prefix((output_ids + drafts[:n])[self.closed_at + 1:], drafts[n:])
                else:
                    n = len(drafts)
                break
            forced, token = self._forced(len(output_ids) + n), drafts[n]
            if token != forced if forced is not None else token in self._banned():
                break
            n += 1
            self._catch_up(output_ids + drafts[:n])
        self._catch_up(output_ids)  # back to where the engine is
        return n

    def _forced(self, index: int) -> int | None:
        """The tag's token the output must take at `index`, once the thinking must close."""
        if self.must_close_at is None or index < self.must_close_at:
            return None
        j = index - self.must_close_at
        return self.end.tag_ids[j] if j < len(self.end.tag_ids) else None

    def _banned(self) -> frozenset[int]:
        """What the thinking may not write: nothing, unless a grammar waits for its end."""
        if self.grammar is None:
            return frozenset()
        return self.end.spills[self.pending[-1] if self.pending else 0] | self.end.stop_ids

    def _catch_up(self, output_ids: list[int]) -> None:
        same = len(self.ids)
        if output_ids[:same] != self.ids:  # went back (speculation): forget what was rejected
            same = next((i for i, (a, b) in enumerate(zip(self.ids, output_ids)) if a != b),
                        min(same, len(output_ids)))
        if same < len(self.ids):
            del self.ids[same:], self.pending[same:]
            if self.closed_at is not None and self.closed_at >= same:
                self.closed_at = self.inner = None
        for i in range(len(self.ids), len(output_ids)):
            self.ids.append(output_ids[i])
            if self.closed_at is not None:
                self.pending.append(0)
                continue
            k, closed = self.end.advance(self.pending[-1] if self.pending else 0, output_ids[i])
            self.pending.append(k)
            if closed:
                self.closed_at = i
                if self.grammar is not None:
                    left = None if self.max_new_tokens is None else self.max_new_tokens - i - 1
                    self.inner = fresh(self.grammar, left)
