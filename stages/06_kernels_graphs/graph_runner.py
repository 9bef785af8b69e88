"""GraphRunner: capture the step once per bucket, then replay it.

A decode step of a small model is hundreds of tiny kernels; on a GPU the CPU time to launch
them exceeds the time to run them. A CUDA graph records the whole step once and replays it
with one launch. The price: everything about the step must be fixed at capture time, so

* inputs live in *static buffers* that each replay refills in place (same addresses);
* shapes are fixed, so decode steps are captured at bucketed batch sizes (1, 2, 4, 8, ...) and a
  batch is padded up to the next bucket. Padding rows are real rows of the computation: each
  writes its K/V to a reserved *dummy block* that no sequence owns, and attends to it alone;
* the block table has a fixed width, so a context longer than `max_seq_len` runs eagerly;
* the step must not sync with the host (sync_guard.py).

Steps that are not all decodes (prefill chunks, a speculative verification) are captured in
*token-count* buckets (16, 32, 64, ... up to `max_num_tokens`), each with room for `max_batch`
sequences: unused sequence slots get no tokens, unused token rows write into the dummy block,
and logits are computed only for the rows a static index names. Their attention must launch a
grid that depends on the padded counts alone (vLLM's idea). Buckets are captured largest first
into one memory pool the smaller ones reuse, as vLLM does.

The capture backend is pluggable: `CudaGraphCapture` on CUDA, `EagerStandIn` elsewhere, which
runs the step eagerly on the same static buffers under the sync guard, so buckets, padding and
sync-freedom are tested on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .step_inputs import Feed, StepBuffers, step_inputs, upload
from .sync_guard import sync_guard

Step = Callable[[], tuple[torch.Tensor, ...]]


@dataclass
class Captured:
    outputs: tuple[torch.Tensor, ...]  # written by every replay, at fixed addresses
    replay: Callable[[], None]


class CudaGraphCapture:
    name = "cuda-graph"

    def __init__(self):
        self.pool = None  # shared by every bucket's graph

    def capture(self, step: Step) -> Captured:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: Triton compiles, lazy inits, allocator
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = step()
        self.pool = graph.pool()
        return Captured(outputs, graph.replay)


class EagerStandIn:
    """What the CPU can check of a capture: the step runs under the sync guard (capture and
    every replay), and its results land in output buffers that never move."""

    name = "eager-stand-in"

    def capture(self, step: Step) -> Captured:
        with sync_guard():
            outputs = tuple(t.clone() for t in step())

        def replay():
            with sync_guard():
                for static, fresh in zip(outputs, step()):
                    static.copy_(fresh)
        return Captured(outputs, replay)


def bucket_sizes(max_batch: int, smallest: int = 1) -> list[int]:
    """smallest, 2 * smallest, ... up to max_batch (which is itself a bucket)."""
    if max_batch < smallest:
        return [max_batch] if max_batch > 0 else []
    sizes, b = [], smallest
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


MIXED_SMALLEST = 16  # the smallest token bucket of a mixed step


class GraphRunner:
    def __init__(self, model, backend, *, max_batch: int, max_seq_len: int, dummy_block: int, capture=None,
                 max_num_tokens: int = 0, max_logit_rows: int | None = None):
        """max_num_tokens: the largest token bucket of mixed steps (0: decode steps only).
        max_logit_rows: how many rows a mixed step computes logits for (default 8 per sequence,
        a verification of 7 drafts); a step that samples more rows runs eagerly."""
        self.model, self.backend = model, backend
        self.capture_backend = capture or (CudaGraphCapture() if model.device.type == "cuda" else EagerStandIn())
        self.buckets = bucket_sizes(max_batch)
        self.token_buckets = bucket_sizes(max_num_tokens, MIXED_SMALLEST) if max_num_tokens else []
        self.block_size = backend.cache.block_size
        self.max_seq_len, self.dummy_block = max_seq_len, dummy_block
        self.width = -(-max_seq_len // self.block_size)
        self.buffers = StepBuffers(max(self.buckets[-1], max_num_tokens), max_batch, self.width, dummy_block,
                                   self.block_size, model.device)
        self.max_logit_rows = max_logit_rows or 8 * max_batch
        self.sample_index = torch.zeros(min(self.max_logit_rows, max(max_num_tokens, 1)), dtype=torch.long,
                                        device=model.device)
        self.graphs: dict[int, Captured] = {}
        self.mixed_graphs: dict[int, Captured] = {}

    def capture_all(self) -> None:
        """Every bucket, the one with most tokens first: the others reuse its pool."""
        todo = [(size, False) for size in self.buckets] + [(tokens, True) for tokens in self.token_buckets]
        for size, mixed in sorted(todo, key=lambda t: (t[0], t[1]), reverse=True):
            if mixed:
                self.mixed_graphs[size] = self.capture_backend.capture(lambda size=size: self._mixed_step(size))
            else:
                self.graphs[size] = self.capture_backend.capture(lambda size=size: self._step(size))

    def fits(self, batch: int, max_seq_len: int) -> bool:
        return batch <= self.buckets[-1] and max_seq_len <= self.max_seq_len

    def fits_mixed(self, num_tokens: int, batch: int, max_seq_len: int, num_samples: int) -> bool:
        return (bool(self.token_buckets) and num_tokens <= self.token_buckets[-1] and batch <= self.buckets[-1]
                and max_seq_len <= self.max_seq_len and num_samples <= self.logit_rows(self.token_buckets[-1]))

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def token_bucket_for(self, num_tokens: int) -> int:
        return next(t for t in self.token_buckets if t >= num_tokens)

    def logit_rows(self, tokens: int) -> int:
        return min(tokens, self.sample_index.shape[0])

    def _step(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured function: the decode forward on the first `size` rows of the buffers."""
        meta = self.backend.build_metadata(**self.buffers.views(size, size, self.width), max_query_len=1,
                                           max_seq_len=self.max_seq_len, graphed=True)
        hidden = self.model(self.buffers.input_ids[:size], self.backend, meta)
        return hidden, self.model.compute_logits(hidden)

    def _mixed_step(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured function of a mixed bucket: `tokens` rows, every sequence slot, and the
        logits of the rows `sample_index` names. `max_query_len` is the bucket's size, a bound
        that depends on the bucket alone (a kernel that sizes its grid by it stays valid)."""
        batch = self.buckets[-1]
        meta = self.backend.build_metadata(**self.buffers.views(tokens, batch, self.width), max_query_len=tokens,
                                           max_seq_len=self.max_seq_len, graphed=True)
        hidden = self.model(self.buffers.input_ids[:tokens], self.backend, meta)
        return hidden, self.model.compute_logits(hidden[self.sample_index[:self.logit_rows(tokens)]])

    @torch.no_grad()
    def run(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], feed: Feed | None = None):
        """Refill the static buffers (padding rows included), replay, and return the real rows'
        (hidden, logits)."""
        if not self.graphs:
            self.capture_all()
        n = len(seqs)
        size = self.bucket_for(n)
        padding = [(0, 1, [])] * (size - n)  # one token each, at position 0, into the dummy block
        inputs = step_inputs(seqs + padding, self.block_size, self.dummy_block, width=self.width)
        self.buffers.fill(token_ids + [0] * len(padding), inputs, feed)
        graph = self.graphs[size]
        graph.replay()
        hidden, logits = graph.outputs
        return hidden[:n], logits[:n]

    @torch.no_grad()
    def run_mixed(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
                  feed: Feed | None = None):
        """A step with prefill chunks or several tokens per sequence: refill the mixed buffers,
        replay the token bucket's graph, and return (hidden of the real rows, logits of
        sample_rows)."""
        if not self.graphs:
            self.capture_all()
        n = len(token_ids)
        tokens, batch = self.token_bucket_for(n), self.buckets[-1]
        empty = [(0, 0, [])] * (batch - len(seqs))  # sequence slots with no tokens: nothing to attend
        inputs = step_inputs(seqs + empty, self.block_size, self.dummy_block, width=self.width, num_tokens=tokens)
        self.buffers.fill(token_ids + [0] * (tokens - n), inputs, feed)
        upload(self.sample_index, sample_rows + [0] * (self.sample_index.shape[0] - len(sample_rows)))
        graph = self.mixed_graphs[tokens]
        graph.replay()
        hidden, logits = graph.outputs
        return hidden[:n], logits[:len(sample_rows)]
