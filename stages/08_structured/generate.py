"""Constrained decoding: any decode loop, with two more lines before sampling.

    logits = model(...)
    matcher.fill_next_token_bitmask(bitmask)   # new: which tokens keep the output valid
    apply_token_bitmask(logits, bitmask)       # new: the others can never be sampled
    token = sample(logits); matcher.accept_token(token)

They live in `GrammarLogitsProcessor`, which rides along in SamplingParams (stage 01's
`logits_processors` hook) and is called with each request's logits before sampling, so the
loop itself is not touched: `ConstrainedGenerator` is stage 02's cached loop unchanged, and
stage 04's batched engine takes the same processor. The mask is applied before temperature,
top-k/top-p and penalties, so sampling renormalises over the allowed tokens: at temperature 1
the output is a sample from the model's distribution conditioned on staying inside the
grammar, one token at a time. Logprobs stay the model's raw ones, as the hook defines.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import numpy as np
import torch

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s02_kv_cache.generate import stream_cached

from .serving.closing import restrict_to_closing
from .matcher import CompiledGrammar, GrammarMatcher, allocate_token_bitmask, apply_token_bitmask, pack_mask


class GrammarLogitsProcessor:
    """The mask as a logits processor (`SamplingParams.logits_processors`), so any loop that
    samples through stage 01's Sequence, stage 04's batched engine and the server included,
    keeps a request inside its grammar. One per request: it holds that request's matcher,
    catches up with the tokens appended since its last call, then masks. If `timings` is
    given, the time of every mask is appended to it.

    An engine may call `prepare(output_ids)` ahead of time, on another thread, while the
    forward pass that produces the logits runs (as GPU engines fill the batch's bitmask
    during the forward); the call that follows then finds the mask ready. The engine waits
    for `prepare` to return before it calls the processor: the two never overlap.

    `close_on_budget` (serving/closing.py): with `max_new_tokens` known, once the tokens left are about
    what the shortest way to close the output needs (+ `margin`), only tokens after which it can
    still close in time are allowed, so the answer ends with the stop token instead of being cut
    at max_new_tokens. The loop's finish_reason stays truthful: "stop" when the stop token was
    sampled, "length" when the budget ran out first."""

    def __init__(self, compiled: CompiledGrammar, timings: list[float] | None = None, *,
                 max_new_tokens: int | None = None, close_on_budget: bool = False, margin: int = 16):
        self.max_new_tokens, self.close_on_budget, self.margin = max_new_tokens, close_on_budget, margin
        self.closing_steps = 0  # masks the closing window cut down
        self.compiled = compiled
        self.matcher = GrammarMatcher(compiled)
        self.bitmask = allocate_token_bitmask(1, compiled.info.vocab_size)
        self.timings = timings
        self.tokens: list[int] = []  # what the matcher has accepted, in order
        self._mask_for: list[int] | None = None  # the tokens whose next-token mask is in self.bitmask

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.prepare(output_ids)
        return apply_token_bitmask(logits.clone(), self.bitmask[0])

    def prepare(self, output_ids: list[int]) -> None:
        """Bring the matcher to `output_ids` and fill the mask of the token after them (once)."""
        self._catch_up(output_ids)
        if self._mask_for == self.tokens:
            return  # filled ahead of time for exactly these tokens
        t0 = time.perf_counter()
        m = self.matcher
        if self.close_on_budget and self.max_new_tokens is not None and not m.is_terminated():
            mask = m.next_token_mask()
            if restrict_to_closing(mask, m.state, self.max_new_tokens - len(self.tokens), m.compiled, self.margin):
                self.closing_steps += 1
            self.bitmask[0].numpy()[:] = pack_mask(mask, self.bitmask.shape[-1])
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
        for t in output_ids[same:]:
            if not m.accept_token(t):
                raise ValueError(f"token {t} was appended although the grammar forbids it")
            self.tokens.append(t)


class ConstrainedGenerator:
    """A `stream_fn(model, seq)` for stage 01's CLI contract: stage 02's cached loop, with the
    request's logits masked by a GrammarLogitsProcessor before every sample. Times each mask."""

    def __init__(self, compiled: CompiledGrammar, max_model_len: int | None = None, *,
                 close_on_budget: bool = False, margin: int = 16):
        self.compiled = compiled
        self.max_model_len = max_model_len
        self.close_on_budget, self.margin = close_on_budget, margin
        self.mask_seconds: list[float] = []

    def __call__(self, model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
        if seq.params.ignore_eos:
            raise ValueError("ignore_eos cannot be used with a grammar: once the output is complete "
                             "only a stop token is allowed")
        processor = GrammarLogitsProcessor(self.compiled, self.mask_seconds, max_new_tokens=seq.params.max_new_tokens,
                                           close_on_budget=self.close_on_budget, margin=self.margin)
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
