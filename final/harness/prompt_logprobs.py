"""Prompt logprobs, computed by the engine while it prefills.

An evaluation harness scores a text by asking how likely each of its tokens was, given the
tokens before it. Row p of a prefill predicts token p+1, so the forward pass the engine runs
anyway already holds every answer:

    prompt    t0    t1    t2    t3          (then the first generated token)
    row        0     1     2     3
    predicts  t1    t2    t3    next
              '-- prompt logprobs --'

The engine keeps every row's final hidden state (stage 06's `last_hidden`); the engine's
`after_forward` hooks hand each step's rows here. For a request that asked, the rows of its prompt go
through the LM head and a log-softmax, chunk by chunk, however many steps its prefill takes.
The answer lands in the request's `ScoredParams.rows`, complete before its first token is sent.

A request that asks computes its whole prompt: a prefix-cache hit would skip the rows it needs
(vLLM skips the cache for such requests too): the one exception to caching, through the block
manager's `prefix_limit`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from course.s01_decode_loop.sampling import SamplingParams


class PromptRow(NamedTuple):
    """How likely prompt token `token_id` was at its position, given the tokens before it."""
    token_id: int
    logprob: float
    rank: int                       # 1: the most likely token
    top: list[tuple[int, float]]    # the k most likely (token id, logprob)


@dataclass
class ScoredParams(SamplingParams):
    """A choice's sampling parameters, asking also for its prompt's logprobs (the k most likely
    tokens at each position besides the prompt's own). The engine thread fills `rows` (one per
    prompt token after the first); the server reads them once the choice's stream has ended."""
    prompt_logprobs: int = 0
    rows: list[PromptRow] = field(default_factory=list)


def scored(params: SamplingParams, k: int, rows: list) -> ScoredParams:
    """`params`, asking for the prompt's logprobs with k alternatives, written into `rows`."""
    given = {f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams)}
    return ScoredParams(**given, prompt_logprobs=k, rows=rows)


def asks(req) -> ScoredParams | None:
    params = req.seq.params
    return params if isinstance(params, ScoredParams) else None


class PromptLogprobs:
    """The engine's prompt scorer, hooked into `engine` (final/engine.py's Engine, before its first
    step). While no request asks it costs one isinstance per chunk per step."""

    def __init__(self, engine):
        self.engine = engine
        # the scheduler asks the block manager about a request by its token ids only (and may have
        # taken it off the waiting queue already): find it among the engine's requests
        # a prompt that must be scored takes no cache hit: its block manager's prefix limit says 0
        # (after any limit already there: a hybrid model's state snapshots)
        earlier = engine.blocks.prefix_limit
        engine.blocks.prefix_limit = lambda ids, hit: 0 if self._scores(ids) else (earlier(ids, hit) if earlier else hit)
        engine.after_forward.append(self.collect)

    def _scores(self, token_ids: list[int]) -> bool:
        return any(req.all_ids is token_ids and asks(req) for req in self.engine.requests.values())

    @torch.no_grad()
    def collect(self, chunks, hidden: torch.Tensor) -> None:
        """After a forward: score the prompt rows of every chunk whose request asked. `chunks` are
        (request, rows) before the engine advances them; `hidden` holds their rows in order."""
        row = 0
        for req, n in chunks:
            params, start = asks(req), req.num_computed_tokens
            last = len(req.seq.prompt_ids) - 1  # row `last` predicts the first generated token
            if params is not None and start < last:
                end = min(start + n, last)
                self._score(params, req.all_ids, start, end, hidden[row:row + end - start])
            row += n

    def _score(self, params: ScoredParams, ids: list[int], start: int, end: int, hidden: torch.Tensor) -> None:
        """Rows start..end-1 predict tokens start+1..end: their logprobs, ranks and top k."""
        logp = torch.log_softmax(self.engine.model.compute_logits(hidden).float(), dim=-1)
        targets = torch.tensor(ids[start + 1:end + 1], device=logp.device)
        chosen = logp.gather(1, targets[:, None])[:, 0]
        ranks = (logp > chosen[:, None]).sum(dim=1) + 1
        k = params.prompt_logprobs
        top_lp, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
        rows = params.rows
        if len(rows) < end:  # a recompute after a preemption writes the same rows again
            rows.extend([None] * (end - len(rows)))
        for i, (token, lp, rank, ids_k, lps_k) in enumerate(zip(
                targets.tolist(), chosen.tolist(), ranks.tolist(), top_ids.tolist(), top_lp.tolist())):
            rows[start + i] = PromptRow(token, lp, rank, list(zip(ids_k, lps_k)))
