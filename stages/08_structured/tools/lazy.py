"""A lazy grammar: free text until a trigger, the grammar from the trigger on.

`tool_choice: "auto"` lets the model answer in words or call a tool. Constraining the whole
answer would forbid the words; constraining nothing would let a call's arguments go wrong.
So the grammar waits: every token is allowed until the output contains the trigger
`<tool_call>`, and from then on the grammar of what follows the trigger (calls.py,
`after_trigger=True`) holds every token, as xgrammar's structural tags (triggered tags) and
llguidance's lazy grammars do.

    "I will check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>"
     |--- free: never masked ---||-- masked by the call grammar ---------------------------------|

The trigger is several tokens here ("<", "tool", "_call", ">"), and the token that completes it
may carry bytes beyond it (">{\""): those bytes are the first the grammar reads. That is the one
place the free part is touched: a token that would complete the trigger *and* carry bytes the
grammar refuses is masked, so whatever completes the trigger leaves a valid start. Every other
token, before the trigger, is allowed.
"""
from __future__ import annotations

import numpy as np
import torch

from ..generate import GrammarLogitsProcessor, MaskNarrower
from ..matcher import CompiledGrammar
from ..pda import DEAD
from ..vocab import TokenizerInfo
from .calls import OPEN


def pending_prefix(text, tag) -> int:
    """How many of `text`'s last bytes (or characters) could be the start of `tag`: the longest end
    of `text` that begins it, short of the whole tag (0 if none)."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0)


class TriggerTokens:
    """For each k (how many of the trigger's first bytes the output already ends with), the tokens
    that would complete the trigger. Computed once per vocabulary and trigger."""

    def __init__(self, info: TokenizerInfo, trigger: str = OPEN):
        self.trigger = t = trigger.encode()
        whole = {i for i, b in enumerate(info.token_bytes) if t in b}
        self.completing = [np.array(sorted(whole | {i for i, b in enumerate(info.token_bytes)
                                                    if k and b.startswith(t[k:])}), dtype=np.int64)
                           for k in range(len(t))]

    def pending(self, text: bytes) -> int:
        """The longest end of `text` that begins the trigger (0 if none)."""
        return pending_prefix(text, self.trigger)


class LazyGrammarLogitsProcessor:
    """Stage 08's logits processor, switched on by a trigger. `compiled` is the grammar of what
    follows the trigger; before it, only tokens that would complete the trigger with bytes the
    grammar refuses are masked. Append-only outputs are followed incrementally; an output that
    went back (speculation) is replayed from its start."""

    def __init__(self, compiled: CompiledGrammar, trigger_tokens: TriggerTokens | None = None, *,
                 max_new_tokens: int | None = None, narrow: MaskNarrower | None = None):
        self.compiled, self.max_new_tokens, self.narrow = compiled, max_new_tokens, narrow
        self.triggers = trigger_tokens or TriggerTokens(compiled.info)
        self.token_bytes, self.pda = compiled.info.token_bytes, compiled.pda
        self._reset()

    def _reset(self) -> None:
        self.ids: list[int] = []                       # tokens read so far
        self.text = b""                                # their bytes, while no trigger has been seen
        self.triggered_at: int | None = None           # the index of the token that completed it
        self.inner: GrammarLogitsProcessor | None = None

    @property
    def triggered(self) -> bool:
        return self.inner is not None

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self._catch_up(output_ids)
        if self.inner is not None:
            return self.inner(output_ids[self.triggered_at + 1:], logits)
        banned = self.banned()
        if not banned:
            return logits  # free text: untouched
        logits = logits.clone()
        logits[..., banned] = float("-inf")
        return logits

    def prepare(self, output_ids: list[int]) -> None:
        self._catch_up(output_ids)
        if self.inner is not None:
            self.inner.prepare(output_ids[self.triggered_at + 1:])

    def valid_prefix(self, output_ids: list[int], drafts: list[int]) -> int:
        """How many drafted tokens to keep (a speculating engine asks): every one the processor
        allows, up to the token that completes the trigger; the grammar judges the rest."""
        self._catch_up(output_ids)
        if self.inner is not None:
            return self.inner.valid_prefix(output_ids[self.triggered_at + 1:], drafts)
        for n, tok in enumerate(drafts):
            if tok in self.banned():
                break
            self._catch_up(output_ids + drafts[:n + 1])
            if self.inner is not None:
                n += 1
                break
        else:
            n = len(drafts)
        self._catch_up(output_ids)  # back to where the engine is (a replay, if it went on)
        return n

    def banned(self) -> list[int]:
        """Before the trigger: the tokens that would complete it with bytes the grammar refuses."""
        t, start = self.triggers.trigger, self.pda.start_state()
        k = self.triggers.pending(self.text)
        tail = self.text[len(self.text) - k:] if k else b""
        out = []
        for tok in self.triggers.completing[k].tolist():
            joined = tail + self.token_bytes[tok]
            rest = joined[joined.find(t) + len(t):]
            if rest and self.pda.walk(start, rest) == DEAD:
                out.append(tok)
        return out

    def _catch_up(self, output_ids: list[int]) -> None:
        if len(output_ids) < len(self.ids) or output_ids[:len(self.ids)] != self.ids:
            self._reset()  # the output went back: replay it
        for i in range(len(self.ids), len(output_ids)):
            tok = output_ids[i]
            self.ids.append(tok)
            if self.inner is not None:
                continue  # the inner processor follows the tokens after the trigger itself
            before = len(self.text)
            self.text += self.token_bytes[tok]
            at = self.text.find(self.triggers.trigger, max(0, before - len(self.triggers.trigger) + 1))
            if at >= 0:
                self._start_grammar(i, self.text[at + len(self.triggers.trigger):])

    def _start_grammar(self, index: int, rest: bytes) -> None:
        left = None if self.max_new_tokens is None else self.max_new_tokens - index - 1
        self.inner = GrammarLogitsProcessor(self.compiled, max_new_tokens=left, narrow=self.narrow)
        if rest and not self.inner.matcher.accept_string(rest):
            raise ValueError(f"the bytes after the trigger, {rest!r}, are not a valid start of the grammar")
        self.triggered_at, self.text = index, b""
