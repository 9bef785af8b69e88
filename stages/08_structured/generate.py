"""Constrained decoding: stage 02's cached loop with one more line before sampling.

    logits = model(...)
    matcher.fill_next_token_bitmask(bitmask)   # new: which tokens keep the output valid
    apply_token_bitmask(logits, bitmask)       # new: the others can never be sampled
    token = sample(logits); matcher.accept_token(token)

Everything else (the KV cache, the sampler, stop handling) is the earlier stages' code. The
mask is applied before temperature, top-k/top-p and penalties, so sampling renormalises over
the allowed tokens: at temperature 1 the output is a sample from the model's distribution
conditioned on staying inside the grammar, one token at a time.

`GrammarLogitsProcessor` is the same two lines packaged for engines that own their loop: it
rides along in SamplingParams and is called with each request's logits before sampling.
"""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s02_kv_cache.generate import forward_step, reserve_cache
from course.s02_kv_cache.kv_cache import ContiguousKVAttention

from .matcher import CompiledGrammar, GrammarMatcher, allocate_token_bitmask, apply_token_bitmask


class ConstrainedGenerator:
    """A `stream_fn(model, seq)` for stage 01's CLI contract that keeps every output inside
    one compiled grammar, and times the mask of every step."""

    def __init__(self, compiled: CompiledGrammar, max_model_len: int | None = None):
        self.compiled = compiled
        self.max_model_len = max_model_len
        self.mask_seconds: list[float] = []

    def __call__(self, model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
        if seq.params.ignore_eos:
            raise ValueError("ignore_eos cannot be used with a grammar: once the output is complete "
                             "only a stop token is allowed")
        matcher = GrammarMatcher(self.compiled)
        bitmask = allocate_token_bitmask(1, self.compiled.info.vocab_size)
        attn = ContiguousKVAttention(reserve_cache(model, seq, self.max_model_len))
        logits = forward_step(model, attn, seq.prompt_ids)
        while True:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            self.mask_seconds.append(time.perf_counter() - t0)
            apply_token_bitmask(logits, bitmask[0])
            event = seq.sample_and_append(logits)
            if not matcher.accept_token(event.token_id):   # cannot happen: the mask forbade it
                raise RuntimeError(f"sampled token {event.token_id} outside the grammar")
            yield event
            if seq.finished:
                return
            logits = forward_step(model, attn, [event.token_id])

    def stats(self) -> dict:
        ms = np.array(self.mask_seconds) * 1e3
        return {"grammar_compile_s": round(self.compiled.compile_seconds, 4), "mask_steps": len(ms),
                "mask_ms_median": float(np.median(ms)) if ms.size else None,
                "mask_ms_p99": float(np.percentile(ms, 99)) if ms.size else None}


class GrammarLogitsProcessor:
    """The same mask as a logits processor (`SamplingParams.logits_processors`), so any loop
    that samples through stage 01's Sequence, stage 04's batched engine and the server
    included, keeps a request inside its grammar. One per request: it holds that request's
    matcher, catches up with the tokens appended since its last call, then masks."""

    def __init__(self, compiled: CompiledGrammar):
        self.matcher = GrammarMatcher(compiled)
        self.bitmask = allocate_token_bitmask(1, compiled.info.vocab_size)

    def __call__(self, output_ids: list[int], logits):
        m = self.matcher
        if len(output_ids) < m.num_accepted:          # the caller dropped tokens (speculation)
            m.rollback(m.num_accepted - len(output_ids))
        for t in output_ids[m.num_accepted:]:
            if not m.accept_token(t):
                raise ValueError(f"token {t} was appended although the grammar forbids it")
        m.fill_next_token_bitmask(self.bitmask)
        return apply_token_bitmask(logits.clone(), self.bitmask[0])
