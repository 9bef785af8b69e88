"""GraphRunner: capture the decode step once per batch-size bucket, then replay it.

A decode step of a small model is hundreds of tiny kernels; on a GPU the CPU time to launch
them exceeds the time to run them. A CUDA graph records the whole step once and replays it
with one launch. The price: everything about the step must be fixed at capture time, so

* inputs live in *static buffers* that each replay refills in place (same addresses);
* shapes are fixed, so the step is captured at bucketed batch sizes (1, 2, 4, 8, ...) and a
  batch is padded up to the next bucket. Padding rows are real rows of the computation: each
  writes its K/V to a reserved *dummy block* that no sequence owns, and attends to it alone;
* the block table has a fixed width, so a context longer than `max_seq_len` runs eagerly;
* the step must not sync with the host (sync_guard.py).

Buckets are captured largest first into one shared memory pool: the smaller graphs reuse the
larger one's intermediate buffers, as vLLM does, so memory does not grow with the bucket count.

The capture backend is pluggable: `CudaGraphCapture` on CUDA, `EagerStandIn` elsewhere. The
stand-in runs the step eagerly on the same static buffers under the sync guard and copies
the result into fixed output buffers, so buckets, padding and sync-freedom are tested on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .model_runner import upload
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


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, ... up to max_batch (which is itself a bucket)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class GraphRunner:
    def __init__(self, model, backend, *, max_batch: int, max_seq_len: int, dummy_block: int, capture=None):
        self.model, self.backend = model, backend
        self.capture_backend = capture or (CudaGraphCapture() if model.device.type == "cuda" else EagerStandIn())
        self.buckets = bucket_sizes(max_batch)
        self.block_size = backend.cache.block_size
        self.max_seq_len, self.dummy_block = max_seq_len, dummy_block
        self.width = -(-max_seq_len // self.block_size)
        n, long = self.buckets[-1], dict(dtype=torch.long, device=model.device)
        self.input_ids = torch.zeros(n, **long)
        self.positions = torch.zeros(n, **long)
        self.seq_lens = torch.ones(n, **long)
        self.slot_mapping = torch.full((n,), dummy_block * self.block_size, **long)
        self.block_tables = torch.full((n, self.width), dummy_block, **long)
        self.cu_seqlens_q = torch.arange(n + 1, **long)  # one token per sequence, always
        self.graphs: dict[int, Captured] = {}

    def capture_all(self) -> None:
        for size in reversed(self.buckets):  # largest first: the others reuse its pool
            self.graphs[size] = self.capture_backend.capture(lambda size=size: self._step(size))

    def fits(self, batch: int, max_seq_len: int) -> bool:
        return batch <= self.buckets[-1] and max_seq_len <= self.max_seq_len

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def _step(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured function: the decode forward on the first `size` rows of the buffers."""
        meta = self.backend.build_metadata(
            positions=self.positions[:size], cu_seqlens_q=self.cu_seqlens_q[:size + 1],
            seq_lens=self.seq_lens[:size], slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size], max_query_len=1, max_seq_len=self.max_seq_len)
        hidden = self.model(self.input_ids[:size], self.backend, meta)
        return hidden, self.model.compute_logits(hidden)

    @torch.no_grad()
    def run(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]]):
        """Refill the static buffers (padding rows included), replay, and return the real rows'
        (hidden, logits)."""
        if not self.graphs:
            self.capture_all()
        n, bs = len(seqs), self.block_size
        size = self.bucket_for(n)
        pad = size - n
        positions = [c for c, _, _ in seqs]  # each sequence's one new token sits at num_cached
        slots = [table[p // bs] * bs + p % bs for p, (_, _, table) in zip(positions, seqs)]
        tables = []
        for _, _, table in seqs:
            used = table[:self.width]
            tables += used + [self.dummy_block] * (self.width - len(used))
        upload(self.input_ids, token_ids + [0] * pad)
        upload(self.positions, positions + [0] * pad)
        upload(self.seq_lens, [p + 1 for p in positions] + [1] * pad)
        upload(self.slot_mapping, slots + [self.dummy_block * bs] * pad)
        upload(self.block_tables.view(-1), tables + [self.dummy_block] * (pad * self.width))
        graph = self.graphs[size]
        graph.replay()
        hidden, logits = graph.outputs
        return hidden[:n], logits[:n]
