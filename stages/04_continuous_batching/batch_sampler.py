"""One sampling call for all the rows of a step.

Stage 01's `Sequence.sample_and_append` picks one request's token: a chain of small ops on one
row, then `int(argmax)`, which on a GPU is a host sync (the CPU waits for the device). A step
that samples 64 requests pays that 64 times. `sample_batch` takes the step's logits
[B, vocab] and the B sequences and does the same work batched:

  per row    logits processors (arbitrary callables: a grammar mask) and penalties (they read
             the row's own token ids), only for the rows that have them;
  batched    greedy rows: one argmax. Sampled rows, as one sub-batch: temperature, top-k,
             top-p, min-p with one parameter per row, each applied to the rows that enable it
             (a disabled filter is never applied, exactly as in stage 01's `process_logits`),
             then stage 01's draw, the exponential race, on each row's own generator;
  once       ONE `.tolist()` for the tokens (and logprobs): the step's only host sync.

The contract (tests/test_batch_sampler.py): every request gets exactly the token stage 01's
per-row sampler gives it and consumes its generator identically, in any crowd. Where a
request's own code raises (its processor), that row alone gets the exception; the others are
sampled.

Below the lesson, a marked section holds what the engine adds for speed: a second draw for the
unseeded rows (`shared`: one uniform a row from the engine's generator instead of one random
number per vocabulary entry) and the copies that keep the host from waiting on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s01_decode_loop.sampling import (SamplingParams, apply_min_p, apply_penalties, apply_top_p,
                                             has_penalties)
from course.s01_decode_loop.sequence import Sequence


@dataclass
class Sample:
    token_id: int
    logprob: float | None = None  # set when the request asked for logprobs (stage 01's `token_logprobs`)
    top_logprobs: list[tuple[int, float]] | None = None


def sample_batch(logits: torch.Tensor, seqs: list[Sequence],
                 shared: torch.Generator | None = None) -> list[Sample | Exception]:
    """logits: [len(seqs), vocab], row i for seqs[i] (the caller appends the tokens). shared:
    the generator every unseeded row draws from, in one call (None: each row draws from its own
    request's generator, stage 01's reference). Returns, per row, its Sample, or the exception
    its processors or penalties raised."""
    if logits.dim() != 2 or logits.shape[0] != len(seqs):
        raise ValueError(f"expected logits [{len(seqs)}, vocab], got shape {tuple(logits.shape)}")
    results: list[Sample | Exception | None] = [None] * len(seqs)
    work = logits.to(torch.float32, copy=True)  # process_logits' first line, for every row at once
    for i, seq in enumerate(seqs):
        try:
            if seq.params.logits_processors or has_penalties(seq.params):
                work[i] = _row_logits(logits[i], seq)
            _check_row(seq, logits.shape[-1], work.device, shared)
        except Exception as e:  # this request's own code failed: drop its row, keep the others
            results[i] = e
    alive = [i for i, r in enumerate(results) if r is None]
    if len(alive) < len(seqs):
        index = to_device(alive, torch.long, logits.device)
        work, logits = work[index], logits[index]
    for i, sample in zip(alive, _sample_rows(work, logits, [seqs[i] for i in alive], shared)):
        results[i] = sample
    return results


def _row_logits(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """What only the row's own state can do, in stage 01's order: processors on the model's
    logits, then float32 and the penalties."""
    vocab = row.shape
    for processor in seq.params.logits_processors:
        row = processor(seq.output_ids, row)
    if not isinstance(row, torch.Tensor) or row.shape != vocab:
        got = tuple(row.shape) if isinstance(row, torch.Tensor) else type(row).__name__
        raise ValueError(f"a logits processor must return logits of shape {tuple(vocab)}, got {got}")
    return apply_penalties(row.to(torch.float32, copy=True), seq.params, seq.prompt_ids, seq.output_ids)


def _check_row(seq: Sequence, vocab: int, device: torch.device, shared: torch.Generator | None) -> None:
    """Fail here, alone, what would otherwise fail inside the batched ops for everyone."""
    if seq.params.logprobs is not None and seq.params.logprobs > vocab:
        raise ValueError(f"logprobs={seq.params.logprobs} asks for more than the vocabulary ({vocab} tokens)")
    if draws_own_noise(seq, shared):
        seq.sampler._generator_for(device)  # made (seeded) now, or a ValueError: it lives on another device


def _sample_rows(work: torch.Tensor, raw: torch.Tensor, seqs: list[Sequence],
                 shared: torch.Generator | None) -> list[Sample]:
    """work: each row's float32 logits after processors and penalties; raw: the model's logits."""
    if not seqs:
        return []
    params = [seq.params for seq in seqs]
    tokens = sample_tokens(work, seqs, shared)
    host = _to_host(tokens, *_logprobs(raw, tokens, params))  # the one sync
    samples = [Sample(int(t)) for t in host[0]]
    _attach_logprobs(samples, params, host[1:])
    return samples


def sample_tokens(work: torch.Tensor, seqs: list[Sequence], shared: torch.Generator | None) -> torch.Tensor:
    """Every row's token, left on the device (no sync): greedy rows by argmax, sampled rows as
    one sub-batch through the filter chain and the race. work: float32 logits after processors."""
    params = [seq.params for seq in seqs]
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if len(sampled) < len(seqs):
        # the greedy rows' tokens (the sampled rows' are replaced below). max().indices is argmax,
        # first index on ties, and on the CPU 1.6x faster over a 49k vocabulary (76 -> 45 us a row)
        tokens = work.max(dim=-1).indices
    if sampled:  # the sampled rows as one sub-batch: the filter chain, then the race
        everyone = len(sampled) == len(seqs)
        index = None if everyone else to_device(sampled, torch.long, work.device)
        x = filter_rows(work if everyone else work[index], [params[i] for i in sampled])
        drawn = _draw(x, [seqs[i] for i in sampled], shared)
        tokens = drawn if everyone else tokens.index_put_((index,), drawn)
    return tokens


def filter_rows(work: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Stage 01's process_logits steps 3-6 (temperature, top-k, top-p, min-p) for a batch
    [B, vocab] with one parameter per row, each step on the sub-batch of sampled rows that
    enable it. Every row comes out bit for bit what stage 01 makes of it alone (tested). May
    write into `work` (the caller's own float32 copy)."""
    vocab = work.shape[-1]

    def rows(enabled) -> list[int]:  # the sampled rows that enable a filter (greedy rows skip them all)
        return [i for i, p in enumerate(params) if not p.greedy and enabled(p)]

    def column(values) -> torch.Tensor:  # one parameter per row: [n, 1], float32 like stage 01's scalars
        return to_device(values, torch.float32, work.device)[:, None]

    hot = rows(lambda p: p.temperature != 1.0)
    work = _on_rows(work, hot, lambda x: x / column([params[i].temperature for i in hot]))
    topk = rows(lambda p: 0 < p.top_k < vocab)  # apply_top_k leaves k >= vocab alone
    work = _on_rows(work, topk, lambda x: _top_k(x, [params[i].top_k for i in topk]))
    topp = rows(lambda p: p.top_p < 1.0)
    work = _on_rows(work, topp, lambda x: apply_top_p(x, column([params[i].top_p for i in topp])))
    minp = rows(lambda p: p.min_p > 0.0)
    return _on_rows(work, minp, lambda x: apply_min_p(x, column([params[i].min_p for i in minp])))


def _on_rows(work: torch.Tensor, rows: list[int], fn) -> torch.Tensor:
    """work with fn applied to the rows `rows` only (a filter on the rows that enable it)."""
    if len(rows) == work.shape[0]:
        return fn(work)
    if rows:
        index = to_device(rows, torch.long, work.device)
        work[index] = fn(work[index])
    return work


def _top_k(x: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Stage 01's apply_top_k with a k per row: the k-th largest value is the same value whether
    it is read from topk(k) or from the sorted topk(max k), so the kept set is the same."""
    k = to_device(ks, torch.long, x.device)[:, None]
    kth = torch.topk(x, max(ks), dim=-1).values.gather(-1, k - 1)
    return x.masked_fill(x < kth, float("-inf"))


def _draw(x: torch.Tensor, seqs: list[Sequence], shared: torch.Generator | None) -> torch.Tensor:
    """Each row's sample from softmax(x) by stage 01's exponential race on its own generator
    (with the engine's `shared` generator the unseeded rows draw otherwise: `draw_shared`, below)."""
    probs = torch.softmax(x, dim=-1)
    own = [j for j, seq in enumerate(seqs) if draws_own_noise(seq, shared)]
    if len(own) < len(seqs):
        return draw_shared(probs, seqs, own, shared)
    return race(probs, seqs, own).max(dim=-1).indices


def race(probs: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> torch.Tensor:
    """Stage 01's exponential race for `rows`: p / q with q ~ Exponential(1) from each row's own
    generator, one number per vocab entry. The argmax of such a row is its sample."""
    q = torch.ones_like(probs)  # rows not in `rows` are someone else's: any finite noise
    for j in rows:
        q[j].exponential_(generator=seqs[j].sampler._generator_for(q.device))
    q.clamp_(min=torch.finfo(q.dtype).tiny)  # q == 0 would make 0/0 = NaN for a -inf token
    return probs / q


def draws_own_noise(seq: Sequence, shared: torch.Generator | None) -> bool:
    """A sampled row draws from its request's own generator when it asked for a seed (or when
    there is no shared generator); an unseeded one draws from the shared generator."""
    return not seq.params.greedy and (shared is None or seq.params.seed is not None)


def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, params) -> list[torch.Tensor]:
    """Stage 01's `token_logprobs` on the device for the rows that ask (on the model's raw
    logits): the chosen tokens' logprobs, then each row's k most likely (ids, values). topk runs
    per row on its own row, as stage 01 runs it: which of several tied tokens it lists depends on k."""
    asked = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not asked:
        return []
    index = to_device(asked, torch.long, raw.device)
    logp = torch.log_softmax(raw[index].float(), dim=-1)
    parts = [logp.gather(-1, tokens[index][:, None])]
    for j, i in enumerate(asked):
        if params[i].logprobs > 0:
            top = torch.topk(logp[j], params[i].logprobs)
            parts += [top.indices, top.values]
    return parts


def _attach_logprobs(samples: list[Sample], params, host: list[list[float]]) -> None:
    """Fill in what `_logprobs` computed, read back in the same order."""
    asked = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not asked:
        return
    chosen, tops = host[0], iter(host[1:])
    for i, logprob in zip(asked, chosen):
        pairs = []
        if params[i].logprobs > 0:
            ids, values = next(tops), next(tops)
            pairs = [(int(t), v) for t, v in zip(ids, values)]
        samples[i].logprob, samples[i].top_logprobs = logprob, pairs


# ================================================================================================
# Beyond the lesson: fewer random numbers, no waiting on the device
#
# `draw_shared`: the engine passes `shared`, its `unseeded_generator`. A row that asked for no
# seed needs no stream of its own, so the unseeded rows draw ONE uniform each, all in one call,
# and take the token where it falls in the row's cumulative probabilities (`inverse_cdf`): the
# race's distribution from one random number a row instead of one per vocabulary entry (tested:
# `-k shared_draw`, `-k unseeded_noise`). Greedy and seeded rows stay exact.
# `to_device` and `_to_host` move the step's small lists and results without extra syncs;
# `samples_on_device` tells a later engine (stage 06's overlap) which rows need no host at all.
# ================================================================================================

def draw_shared(probs: torch.Tensor, seqs: list[Sequence], own: list[int], shared: torch.Generator) -> torch.Tensor:
    """`_draw` when some rows draw from `shared`: those by `inverse_cdf`, all in ONE call; the
    rows in `own` (seeded) by the race on their own generators, as in the lesson."""
    if not own:
        return inverse_cdf(probs, shared)
    tokens = race(probs, seqs, own).max(dim=-1).indices  # the unseeded rows' are replaced below
    seeded = set(own)
    rest = to_device([j for j in range(len(seqs)) if j not in seeded], torch.long, probs.device)
    return tokens.index_put_((rest,), inverse_cdf(probs[rest], shared))


def inverse_cdf(probs: torch.Tensor, shared: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` from one uniform u per row: the first token whose cumulative
    probability exceeds u x the row's total. The race needs a number per vocab entry (on our
    CPU, exponential_ for 40 rows x 49k takes ~65 ms, a third of a decode step); this needs one
    per row. Cumulated in float64 so the last tokens keep their share; `right=True` never picks
    a zero-probability token, whose cumulative value equals the one before it."""
    cdf = probs.to(torch.float64).cumsum_(dim=-1)
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device, generator=shared)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze_(-1).clamp_(max=probs.shape[-1] - 1)


def samples_on_device(seq: Sequence) -> bool:
    """Can this row's token be drawn without the host knowing its output so far? Not with
    processors or penalties (they read its token ids), nor logprobs (read back with the token)."""
    p = seq.params
    return not p.logits_processors and not has_penalties(p) and p.logprobs is None


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without waiting for it: `torch.tensor(values, device=cuda)`
    copies from pageable memory and waits for the device to drain, a sync in the middle of a step."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def _to_host(*tensors: torch.Tensor) -> list[list[float]]:
    """Every tensor's values on the host through ONE copy (one sync): packed as float64, which
    holds token ids (< 2**53) and float32 logprobs exactly."""
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).tolist()
    out, start = [], 0
    for t in tensors:
        out.append(flat[start:start + t.numel()])
        start += t.numel()
    return out
