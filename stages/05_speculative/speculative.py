"""The speculative loop: draft k, verify k+1 positions in ONE target forward, keep what the
target agrees with, roll the cache back past the first rejection.

    prefill                       -> first token, as in stage 02
    repeat:
      draft   = drafter.propose(seq, k)                 (cheap)
      logits  = target([last, d_1 .. d_k])              (one forward, k+1 positions)
      emitted = verify(logits, draft)                   (1 .. k+1 tokens)
      cache.num_tokens = tokens whose K/V are still right (the accepted prefix)

Decode is memory-bound: reading the weights dominates a one-token step, so a (k+1)-token step
costs about the same. Each forward emits 1 + (accepted drafts) tokens instead of 1.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sampling import process_logits
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s02_kv_cache.generate import check_max_len, reserve_cache, step_metadata
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache

from .drafter import Drafter
from .tree import TreeAttention, VerifyCost, accept_greedy_path, block_metadata, compact
from .verify import verify_greedy, verify_sampled


@dataclass
class SpecStats:
    target_forwards: int = 0   # decode-phase target forwards (each verifies one draft)
    proposed: int = 0          # drafted tokens sent to verification
    accepted: int = 0          # drafted tokens the target kept
    emitted: int = 0           # tokens produced by those forwards (accepted + one per forward)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target forward (1 = no gain; k+1 = every draft accepted)."""
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    def record(self, proposed: int, emitted: int) -> None:
        """One verification: `proposed` drafts checked, `emitted` tokens out (accepted + 1)."""
        self.target_forwards += 1
        self.proposed += proposed
        self.accepted += emitted - 1
        self.emitted += emitted

    def to_json(self) -> dict:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate,
                               "mean_accepted_length": self.mean_accepted_length}


@torch.no_grad()
def forward_hidden(model: CausalLM, attn: ContiguousKVAttention, token_ids: list[int]) -> torch.Tensor:
    """Like stage 02's forward_step, but the final hidden state of every position:
    [len(token_ids), hidden] (an EAGLE drafter feeds on them; lm_head turns rows into logits)."""
    start = attn.cache.num_tokens
    ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
    return model(ids, attn, step_metadata(start, len(token_ids), model.device))


def verifier(model: CausalLM, context: int, widest: int, tree: bool = False):
    """verify(width): one target forward over `width` new tokens after the same `context` cached
    ones (the verify step of k = width - 1), rolled back after each call, for timing. `tree`:
    through the tree loop's attention (an explicit mask), which costs more than a chain's."""
    cache = KVCache(model.config, context + widest, model.dtype, model.device)
    vocab = model.config.vocab_size
    forward_hidden(model, ContiguousKVAttention(cache), [(100 + i) % vocab for i in range(context)])

    @torch.no_grad()
    def verify(width: int) -> None:
        cache.num_tokens = context
        if tree:  # a chain-shaped tree: the mask's shape does not change the work
            attention = TreeAttention(cache, context, torch.ones(width, width, dtype=torch.bool).tril())
            meta = block_metadata(context, list(range(context, context + width)), model.device)
            hidden = model(torch.arange(width, device=model.device), attention, meta)
        else:
            hidden = forward_hidden(model, ContiguousKVAttention(cache), list(range(width)))
        model.compute_logits(hidden)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
    return verify


def measure_verify_cost(model: CausalLM, context: int = 128, widths=(1, 2, 3, 4, 5, 9, 17), reps: int = 5) -> VerifyCost:
    """What verifying a tree costs on this machine: the fastest of `reps` verify forwards (after
    one warm-up) at a few widths, measured once, at start-up."""
    verify, seconds = verifier(model, context, max(widths), tree=True), {}
    for width in widths:
        verify(width)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            verify(width)
            times.append(time.perf_counter() - start)
        seconds[width] = min(times)
    return VerifyCost(seconds)


def processed_rows(logits: torch.Tensor, seq: Sequence, before: list[list[int]]) -> torch.Tensor:
    """Process each verified row as if the drafted tokens `before[row]` had been emitted ahead
    of it (penalties see them): a chain's row i follows its first i drafts, a tree's row follows
    its node's path. The request's logits processors (a grammar) act first, as in
    `Sequence.sample_and_append`. Returns processed logits, or probabilities for a sampled request.

    A draft the processors forbid is always rejected (its probability is 0), so the rows after
    it are never read; they are not shown to the processors (a grammar cannot even follow a
    forbidden token) and repeat the last row instead."""
    rows, blocked = [], False
    for r, drafts in enumerate(before):
        blocked = blocked or bool(r and seq.params.logits_processors and rows[-1][drafts[-1]] == float("-inf"))
        if blocked:  # its path holds a forbidden draft: verification stops before this row
            rows.append(rows[-1])
            continue
        row = logits[r]
        for processor in seq.params.logits_processors:
            row = processor(seq.output_ids + drafts, row)
        rows.append(process_logits(row, seq.params, seq.prompt_ids, seq.output_ids + drafts))
    out = torch.stack(rows)
    return out if seq.params.greedy else torch.softmax(out, dim=-1)


def prefill(model: CausalLM, attn, seq: Sequence, drafter: Drafter) -> TokenEvent:
    """Prefill as in stage 02, show the drafter the prompt's features, emit the first token."""
    drafter.begin(seq)
    hidden = forward_hidden(model, attn, seq.prompt_ids)
    drafter.observe(drafter.features_of(hidden), start=0)
    return seq.sample_and_append(model.compute_logits(hidden[-1:])[0])


def emit(seq: Sequence, tokens: list[int]) -> Iterator[TokenEvent]:
    """Append verified tokens one by one; EOS or a stop string inside the run ends it there."""
    for token in tokens:
        yield seq.append(token)
        if seq.finished:
            return


def stream_speculative(model: CausalLM, seq: Sequence, drafter: Drafter, k: int = 4,
                       max_model_len: int | None = None, stats: SpecStats | None = None,
                       cache: KVCache | None = None) -> Iterator[TokenEvent]:
    """Stream `seq`'s tokens, drafting up to k per target forward. `stats` (if given) is filled
    in as it runs; `cache` (if given) is used instead of a fresh one, so tests can inspect it."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    stats = stats if stats is not None else SpecStats()
    generator = torch.Generator(device=model.device).manual_seed(seq.sampler.seed)  # acceptance draws
    attn = ContiguousKVAttention(cache if cache is not None else reserve_cache(model, seq, max_model_len))
    yield prefill(model, attn, seq, drafter)
    while not seq.finished:
        # cache: every token but the last. Draft no further than the request may grow, so the
        # k+1 verified positions always fit in the cache reserved for prompt + max_new_tokens.
        room = seq.params.max_new_tokens - len(seq.output_ids)
        draft = drafter.propose(seq, min(k, room - 1))
        cached = attn.cache.num_tokens
        hidden = forward_hidden(model, attn, [seq.all_ids[-1]] + draft.tokens)
        target = processed_rows(model.compute_logits(hidden), seq,
                                [draft.tokens[:i] for i in range(len(draft.tokens) + 1)])
        if seq.params.greedy:
            emitted = verify_greedy(target, draft.tokens)
        else:
            emitted = verify_sampled(target, draft.tokens, draft.probs, generator)
        attn.cache.num_tokens = cached + len(emitted)  # K/V of [last, accepted drafts]; drop the rest
        drafter.observe(drafter.features_of(hidden)[:len(emitted)], start=cached)
        stats.record(len(draft.tokens), len(emitted))
        yield from emit(seq, emitted)


def stream_tree_speculative(model: CausalLM, seq: Sequence, drafter, depth: int = 5, top_k: int = 4,
                            max_nodes: int = 16, stats: SpecStats | None = None,
                            cache: KVCache | None = None, verify_cost: VerifyCost | None = None) -> Iterator[TokenEvent]:
    """The loop with EAGLE-2 trees (greedy only): draft a tree, verify it in one forward with a
    tree mask, walk the accepted path, move its K/V into place. With `verify_cost` each tree
    keeps only the nodes that pay for their verify (tree.py's tree_size)."""
    if not seq.params.greedy:
        raise ValueError("tree speculation verifies greedy requests only (temperature 0); "
                         "use the chain (--method eagle) for sampling")
    if seq.params.logits_processors:
        raise ValueError("tree speculation does not apply logits processors (a grammar) yet; "
                         "use the chain, which does")
    stats = stats if stats is not None else SpecStats()
    if cache is None:  # the tree block may reach max_nodes slots past the sequence
        need = check_max_len(seq, model.config.max_position_embeddings)
        cache = KVCache(model.config, need + max_nodes, model.dtype, model.device)
    yield prefill(model, ContiguousKVAttention(cache), seq, drafter)
    while not seq.finished:
        room = seq.params.max_new_tokens - len(seq.output_ids)
        tree = drafter.propose_tree(seq, min(depth, room - 1), top_k, max_nodes, verify_cost)
        start = cache.num_tokens
        ids = torch.tensor([seq.all_ids[-1]] + tree.tokens, device=model.device)
        positions = [start] + [start + d for d in tree.depths]
        with torch.no_grad():
            hidden = model(ids, TreeAttention(cache, start, tree.block_mask()),
                           block_metadata(start, positions, model.device))
        before = [[]] + [[tree.tokens[i] for i in tree.path_to(node)] for node in range(len(tree))]
        choices = torch.argmax(processed_rows(model.compute_logits(hidden), seq, before), dim=-1).tolist()
        path, emitted = accept_greedy_path(tree, choices)
        drafter.calibration.record(tree, path)  # what the target kept, against what the head expected
        compact(cache, start, path)
        drafter.observe(drafter.features_of(hidden)[[0] + [1 + i for i in path]], start=start)
        stats.record(len(tree), len(emitted))
        yield from emit(seq, emitted)


class SpeculativeGenerator:
    """The stage CLI's `stream_fn(model, seq)`: one drafter, one k (or a tree shape), and the
    statistics of the last request."""

    def __init__(self, drafter: Drafter, k: int = 4, tree: dict | None = None, verify_cost: VerifyCost | None = None):
        self.drafter, self.k, self.tree, self.verify_cost = drafter, k, tree, verify_cost
        self.last = SpecStats()

    def __call__(self, model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
        self.last = SpecStats()
        if self.tree is not None:
            return stream_tree_speculative(model, seq, self.drafter, stats=self.last, verify_cost=self.verify_cost,
                                           **self.tree)
        return stream_speculative(model, seq, self.drafter, self.k, stats=self.last)

    def stats(self) -> dict:
        shape = {"tree": self.tree | {"sized_by": "cost" if self.verify_cost else "fixed"}} if self.tree is not None \
            else {"k": self.k}
        return {"method": self.drafter.name + ("-tree" if self.tree is not None else "")} | shape | self.last.to_json()
