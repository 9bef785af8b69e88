"""One request's life after the model: sample, detokenize, check stop conditions, time it.

This is the part of an engine that does not care how logits were computed, so every later
stage reuses it unchanged: only the way logits are produced (the loop) changes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .detokenizer import IncrementalDetokenizer
from .sampling import Sampler, SamplingParams, token_logprobs
from .stop import StopChecker


@dataclass
class TokenEvent:
    """What a streaming loop yields per generated token."""
    token_id: int
    text: str                    # new text safe to show now (may be "")
    finish_reason: str | None    # None while running, then "stop" or "length"
    logprob: float | None = None  # filled when the request asked for logprobs
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class GenerationOutput:
    prompt_ids: list[int]
    token_ids: list[int]         # generated ids, including a final EOS/stop token if one ended it
    text: str                    # detokenized, stop string removed
    finish_reason: str
    ttft_s: float                # time to first token (the prefill)
    tpot_s: float                # mean time per output token after the first
    token_times_s: list[float] = field(default_factory=list)  # when each token was ready, from start

    def to_json(self, prompt: str | None = None) -> dict:
        n = len(self.token_ids)
        total = self.token_times_s[-1] if self.token_times_s else 0.0
        return {"prompt": prompt, "token_ids": self.token_ids, "text": self.text,
                "finish_reason": self.finish_reason, "num_prompt_tokens": len(self.prompt_ids),
                "num_generated_tokens": n, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "total_s": total, "tokens_per_s": n / total if total else None}


class Sequence:
    """A request's post-processing state: its sampler (own seeded RNG), detokenizer and
    stop checker, the generated ids, and the finish reason once it is done."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, tokenizer, eos_token_ids=()):
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.output_ids: list[int] = []
        # prompt then output in ONE list that grows by a token per append: an engine slices it
        # every step instead of building prompt_ids + output_ids for every request
        self._all_ids = list(self.prompt_ids)
        self.finish_reason: str | None = None
        self.sampler = Sampler(params)
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=self.prompt_ids)
        self.stop_checker = StopChecker(params.stop)
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.text = ""
        self.start_time = time.perf_counter()
        self.token_times: list[float] = []

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output ids: the sequence's own growing buffer, not a copy (read, never write)."""
        return self._all_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def sample(self, logits: torch.Tensor) -> int:
        return self.sampler.sample(logits, self.prompt_ids, self.output_ids)

    def sample_and_append(self, logits: torch.Tensor) -> TokenEvent:
        """Sample the next token from `logits` [vocab], record it, and attach its logprobs when
        the request asked for them. Logits processors act first; logprobs stay the raw model's."""
        processed = logits
        for processor in self.params.logits_processors:
            processed = processor(self.output_ids, processed)
        token_id = self.sample(processed)
        event = self.append(token_id)
        if self.params.logprobs is not None:
            event.logprob, event.top_logprobs = token_logprobs(logits, token_id, self.params.logprobs)
        return event

    def reserve(self) -> None:
        """Hold a place in all_ids for a token drawn on the device whose id is not read yet (an
        engine that runs the next step before reading this one's tokens); `append` fills it."""
        self._all_ids.append(-1)

    def append(self, token_id: int) -> TokenEvent:
        """Record a sampled token; return the text it makes safe to emit."""
        assert not self.finished, "append() after the sequence finished"
        self.output_ids.append(token_id)
        known = len(self.prompt_ids) + len(self.output_ids)
        if known <= len(self._all_ids):
            self._all_ids[known - 1] = token_id  # the place `reserve` held
        else:
            self._all_ids.append(token_id)
        self.token_times.append(time.perf_counter() - self.start_time)
        if token_id in self.stop_ids:  # its own text is not shown
            # a logits processor that shaped the ending may name it (a grammar that closed the
            # answer early to fit max_new_tokens says "length")
            self.finish_reason = next((p.finish_reason for p in self.params.logits_processors
                                       if getattr(p, "finish_reason", None)), "stop")
            delta = self._flush()
        else:
            delta, hit_stop_string = self.stop_checker.push(self.detokenizer.add(token_id))
            if hit_stop_string:
                self.finish_reason = "stop"  # text after the stop string is dropped
            elif len(self.output_ids) >= self.params.max_new_tokens:
                self.finish_reason = "length"
                delta += self._flush()
        self.text += delta
        return TokenEvent(token_id, delta, self.finish_reason)

    def _flush(self) -> str:
        """At the end, release text held back for a possible stop string or a split character."""
        delta, _ = self.stop_checker.push(self.detokenizer.flush())
        return delta + self.stop_checker.flush()

    def output(self) -> GenerationOutput:
        t = self.token_times
        tpot = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0
        return GenerationOutput(self.prompt_ids, self.output_ids, self.text, self.finish_reason or "length",
                                t[0] if t else 0.0, tpot, list(t))
