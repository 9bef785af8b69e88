"""Constrained decoding: any decode loop, with two more lines before sampling.

    logits = model(...)
    matcher.fill_next_token_bitmask(bitmask)   # new: which tokens keep the output valid
    apply_token_bitmask(logits, bitmask)       # new: the others can never be sampled
    token = sample(logits); matcher.accept_token(token)

They live in `GrammarLogitsProcessor`, which rides in stage 01's `logits_processors` hook, so
the loop is not touched: `ConstrainedGenerator` is stage 02's cached loop unchanged, and stage
04's batched engine takes the same processor. The mask comes before temperature, top-k/top-p
and penalties, so sampling renormalises over the allowed tokens: at temperature 1 the output is
a sample from the model's distribution conditioned on staying inside the grammar, one token at
a time. Logprobs stay the model's raw ones, as the hook defines.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import numpy as np
import torch

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s02_kv_cache.generate import stream_cached

from .matcher import (CompiledGrammar, GrammarMatcher, allocate_token_bitmask, apply_token_bitmask, pack_mask,
                      write_bitmask)

# May cut the grammar's mask (bool [vocab], in place) further, given the request's matcher and
# the tokens it has left; returns whether it did. E.g. serving/closing.py's CloseOnBudget.
MaskNarrower = Callable[[np.ndarray, GrammarMatcher, int], bool]


class GrammarLogitsProcessor:
    """The mask as a logits processor (`SamplingParams.logits_processors`): any loop that samples
    through stage 01's Sequence (stage 04's engine, the server) keeps a request in its grammar.
    One per request: it holds the request's matcher, catches up with the tokens appended since
    its last call, then masks. If `timings` is given, each mask's time is appended to it.

    An engine may call `prepare(output_ids)` ahead of time, on another thread, while the forward
    pass runs (as GPU engines fill the batch's bitmask during the forward); the call that follows
    finds the mask ready. The engine waits for `prepare` to return: the two never overlap.

    `narrow` (a MaskNarrower), with `max_new_tokens` known, may cut each mask further by what the
    request has left: serving/'s CloseOnBudget keeps only tokens after which the output can
    still close before max_new_tokens, so the answer ends with the stop token."""

    def __init__(self, compiled: CompiledGrammar, timings: list[float] | None = None, *,
                 max_new_tokens: int | None = None, narrow: MaskNarrower | None = None):
        self.max_new_tokens, self.narrow, self.timings = max_new_tokens, narrow, timings
        self.narrowed_steps = 0  # masks `narrow` cut down
        self._unnarrowed: np.ndarray | None = None  # this step's grammar mask, if `narrow` cut it
        self._cuts: set[int] = set()  # positions where `narrow` took the model's first choice away
        self.compiled, self.matcher = compiled, GrammarMatcher(compiled)
        self.bitmask = allocate_token_bitmask(1, compiled.info.vocab_size)
        self.tokens: list[int] = []  # what the matcher has accepted, in order
        self._mask_for: list[int] | None = None  # the tokens whose next-token mask is in self.bitmask

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.prepare(output_ids)
        out = apply_token_bitmask(logits.clone(), self.bitmask[0])
        if self._unnarrowed is not None:  # the budget narrowed this mask: did it take the model's choice?
            allowed = torch.from_numpy(self._unnarrowed[:logits.shape[-1]]).to(logits.device)  # ids past the logits: none
            first = int(torch.where(allowed, logits, float("-inf")).argmax())
            if out[first] == float("-inf"):
                self._cuts.add(len(self.tokens))
        return out

    @property
    def finish_reason(self) -> str | None:
        """"length" once the budget took the model's first choice away at a token the answer kept:
        it closes, valid, but shorter than the model would have written (a stop token then
        ends it with this reason, not "stop"; see stage 01's Sequence). None otherwise."""
        return "length" if self._cuts else None

    def prepare(self, output_ids: list[int]) -> None:
        """Bring the matcher to `output_ids` and fill the mask of the token after them (once)."""
        self._catch_up(output_ids)
        if self._mask_for == self.tokens:
            return  # filled ahead of time for exactly these tokens
        t0 = time.perf_counter()
        m, self._unnarrowed = self.matcher, None
        if self.narrow is not None and self.max_new_tokens is not None and not m.is_terminated():
            mask = m.next_token_mask()
            before = mask.copy()
            narrowed = self.narrow(mask, m, self.max_new_tokens - len(self.tokens))
            self.narrowed_steps += narrowed
            self._unnarrowed = before if narrowed else None
            write_bitmask(self.bitmask, 0, pack_mask(mask))
        else:
            m.fill_next_token_bitmask(self.bitmask)
        if self.timings is not None:
            self.timings.append(time.perf_counter() - t0)
        self._mask_for = list(self.tokens)

    def valid_prefix(self, output_ids: list[int], drafts: list[int]) -> int:
        """How many of `drafts`, appended to `output_ids`, the grammar allows in a row. A
        speculating engine cuts a draft there: rows past it would be rejected anyway."""
        self._catch_up(output_ids)
        n = 0
        while n < len(drafts) and self.matcher.accept_token(drafts[n]):
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def _catch_up(self, output_ids: list[int]) -> None:
        m = self.matcher
        # Speculation asks for masks after drafted tokens, then keeps only some of them (and a
        # correction in place of the first rejected one): roll back to what the two agree on.
        same = len(self.tokens)
        if output_ids[:same] != self.tokens:  # (a C-speed compare in the usual, append-only case)
            same = next((i for i, (a, b) in enumerate(zip(self.tokens, output_ids)) if a != b),
                        min(len(self.tokens), len(output_ids)))
        if same < len(self.tokens):
            m.rollback(len(self.tokens) - same)
            del self.tokens[same:]
            self._cuts = {p for p in self._cuts if p <= same}  # cuts behind rejected drafts never happened
        for t in output_ids[same:]:
            if not m.accept_token(t):
                raise ValueError(f"token {t} was appended although the grammar forbids it")
            self.tokens.append(t)


class ConstrainedGenerator:
    """A `stream_fn(model, seq)` for stage 01's CLI contract: stage 02's cached loop, with the
    request's logits masked by a GrammarLogitsProcessor (with `narrow`) before every sample.
    Times each mask."""

    def __init__(self, compiled: CompiledGrammar, max_model_len: int | None = None, *,
                 narrow: MaskNarrower | None = None):
        self.compiled, self.max_model_len, self.narrow = compiled, max_model_len, narrow
        self.mask_seconds: list[float] = []

    def __call__(self, model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
        if seq.params.ignore_eos:
            raise ValueError("ignore_eos cannot be used with a grammar: once the output is complete "
                             "only a stop token is allowed")
        processor = GrammarLogitsProcessor(self.compiled, self.mask_seconds, max_new_tokens=seq.params.max_new_tokens,
                                           narrow=self.narrow)
        # A copy of the request's params with the processor added: the caller's params object
        # may be shared by other prompts (the CLI uses one for all), so it is left untouched.
        seq.params = dataclasses.replace(seq.params, logits_processors=[*seq.params.logits_processors, processor])
        return stream_cached(model, seq, self.max_model_len)

    def stats(self) -> dict:
        ms = np.array(self.mask_seconds) * 1e3
        return {"grammar_compile_s": round(self.compiled.compile_seconds, 4), "mask_steps": len(ms),
                "mask_ms_median": float(np.median(ms)) if ms.size else None,
                "mask_ms_p99": float(np.percentile(ms, 99)) if ms.size else None,
                # what a best-effort JSON schema compile relaxed (json_schema/modes.py)
                "warnings": [w.to_json() for w in self.compiled.grammar.warnings]}
