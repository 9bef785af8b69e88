"""Mixed steps on a graph: prefill chunks, decodes and verifications in token-count buckets.

The lesson's GraphRunner captures decode steps by batch size; any other step runs eagerly, and
with chunked prefill and speculation that is most steps that hold a prompt. Here such a step is
captured by *token count* (16, 32, 64, ... up to `graph_max_num_tokens`), each bucket with room
for `max_batch` sequences:

    rows     | chunk of seq 0 | decode 1 | verify 2 (k+1) | padding rows ... | (bucket: 32)
    slots    | seq 0          | seq 1    | seq 2          | empty slots: no rows, no keys

Rows of no sequence sit at position 0 and write their K/V into the dummy block; logits are
computed only for the rows a static index names (`sample_index`). Attention must launch a grid
that depends on the padded counts alone (vLLM's idea): the lesson's varlen kernel sizes its grid
by `max_query_len`, here the bucket's size; the torch backend runs varlen_gather.py. Decode and
token buckets share one memory pool, the bucket with most tokens captured first.

    KernelEngineConfig(..., cuda_graphs=True, graph_max_num_tokens=512)   # mixed_graphs.register() first
"""
from __future__ import annotations

import torch

from ..engine import Extension
from ..graph_runner import Captured, GraphRunner, bucket_sizes, replayed, with_taps
from ..step_inputs import Feed, StepBuffers, StepInputs, step_inputs, upload

SMALLEST = 16  # the smallest token bucket


def mixed_inputs(seqs: list[tuple[int, int, list[int]]], block_size: int, dummy_block: int, width: int,
                 num_seqs: int, num_tokens: int) -> StepInputs:
    """step_inputs of a token bucket: `num_seqs` sequence slots, the empty ones `(0, 0, [])`, and
    `num_tokens` rows, those of no sequence at position 0 with their K/V into the dummy block."""
    inputs = step_inputs(seqs + [(0, 0, [])] * (num_seqs - len(seqs)), block_size, dummy_block, width=width)
    pad = num_tokens - len(inputs.positions)
    inputs.positions += [0] * pad
    inputs.slot_mapping += [dummy_block * block_size] * pad
    return inputs


class MixedGraphRunner(GraphRunner):
    def __init__(self, model, backend, *, max_batch: int, max_seq_len: int, dummy_block: int, capture=None,
                 max_num_tokens: int, max_logit_rows: int | None = None):
        """max_num_tokens: the largest token bucket (0: decode steps only, as the lesson's runner).
        max_logit_rows: how many rows a mixed step computes logits for (default 8 per sequence,
        a verification of 7 drafts); a step that samples more rows runs eagerly."""
        super().__init__(model, backend, max_batch=max_batch, max_seq_len=max_seq_len, dummy_block=dummy_block,
                         capture=capture)
        self.token_buckets = bucket_sizes(max_num_tokens, SMALLEST) if max_num_tokens else []
        self.buffers = StepBuffers(max(max_batch, max_num_tokens), max_batch, self.width, dummy_block,
                                   self.block_size, model.device)  # rows for the largest token bucket too
        self.sample_index = torch.zeros(min(max_logit_rows or 8 * max_batch, max(max_num_tokens, 1)),
                                        dtype=torch.long, device=model.device)
        self.mixed_graphs: dict[int, Captured] = {}

    def capture_all(self) -> None:
        """Every bucket of both kinds, the one with most tokens first: the others reuse its pool."""
        todo = [(size, False) for size in self.buckets] + [(tokens, True) for tokens in self.token_buckets]
        for size, mixed in sorted(todo, reverse=True):
            if mixed:
                self.mixed_graphs[size] = self.capture_backend.capture(lambda size=size: self._mixed_step(size))
            else:
                self.graphs[size] = self.capture_backend.capture(lambda size=size: self._step(size))

    def held(self) -> int:
        return super().held() + len(self.mixed_graphs)

    def fits_mixed(self, num_tokens: int, batch: int, max_seq_len: int, num_samples: int) -> bool:
        return (bool(self.token_buckets) and num_tokens <= self.token_buckets[-1] and batch <= self.buckets[-1]
                and max_seq_len <= self.max_seq_len and num_samples <= self.logit_rows(self.token_buckets[-1]))

    def token_bucket_for(self, num_tokens: int) -> int:
        return next(t for t in self.token_buckets if t >= num_tokens)

    def logit_rows(self, tokens: int) -> int:
        return min(tokens, self.sample_index.shape[0])

    def _mixed_step(self, tokens: int) -> tuple[torch.Tensor, ...]:
        """The captured function of a token bucket: `tokens` rows, every sequence slot, and the
        logits of the rows `sample_index` names. `max_query_len` is the bucket's size, a bound
        that depends on the bucket alone (a kernel that sizes its grid by it stays valid)."""
        batch = self.buckets[-1]
        meta = self.backend.build_metadata(**self.buffers.views(tokens, batch, self.width), max_query_len=tokens,
                                           max_seq_len=self.max_seq_len, graphed=True)
        hidden = self.model(self.buffers.input_ids[:tokens], self.backend, meta)
        return with_taps(self.model, (hidden, self.model.compute_logits(hidden[self.sample_index[:self.logit_rows(tokens)]])))

    def replay(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
               feed: Feed | None = None):
        """A decode bucket where the step is all decodes, else a token bucket where it fits one."""
        decoded = super().replay(token_ids, seqs, sample_rows, feed)
        max_seq_len = max(c + n for c, n, _ in seqs)
        if decoded is None and self.fits_mixed(len(token_ids), len(seqs), max_seq_len, len(sample_rows)):
            return self.run_mixed(token_ids, seqs, sample_rows, feed)
        return decoded

    @torch.no_grad()
    def run_mixed(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
                  feed: Feed | None = None):
        """Refill the buffers for the step's token bucket, replay its graph, and return (hidden of
        the real rows, logits of sample_rows)."""
        if not self.graphs:
            self.capture_all()
        n = len(token_ids)
        tokens = self.token_bucket_for(n)
        inputs = mixed_inputs(seqs, self.block_size, self.dummy_block, self.width, self.buckets[-1], tokens)
        self.buffers.fill(token_ids + [0] * (tokens - n), inputs, feed)
        upload(self.sample_index, sample_rows + [0] * (self.sample_index.shape[0] - len(sample_rows)))
        graph = self.mixed_graphs[tokens]
        graph.replay()
        hidden, logits = replayed(self.model, graph.outputs, n)
        return hidden[:n], logits[:len(sample_rows)]


class MixedGraphs(Extension):
    """The engine's graphs with token buckets beside the decode ones (`graph_max_num_tokens`)."""

    def __init__(self, max_num_tokens: int):
        self.max_num_tokens = max_num_tokens

    @classmethod
    def of(cls, engine) -> "MixedGraphs | None":
        config = engine.config
        return cls(min(config.graph_max_num_tokens, config.max_num_batched_tokens)) if config.cuda_graphs else None

    def graph_runner(self, model, backend, **shape) -> MixedGraphRunner:
        return MixedGraphRunner(model, backend, **shape, max_num_tokens=self.max_num_tokens)
