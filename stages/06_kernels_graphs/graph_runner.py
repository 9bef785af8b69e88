"""GraphRunner: capture the decode step once per bucket, then replay it.

A small model's decode step is launch-bound (hundreds of tiny kernels). A CUDA graph records the
whole step once and replays it with one launch; everything about it is fixed at capture, so

* inputs live in *static buffers* that each replay refills in place (same addresses);
* shapes are fixed, so decode steps are captured at bucketed batch sizes (1, 2, 4, 8, ...) and a
  batch is padded up to the next bucket. Padding rows are real rows of the computation: each
  writes its K/V to a reserved *dummy block* that no sequence owns, and attends to it alone;
* the block table has a fixed width, so a context longer than `max_seq_len` runs eagerly;
* the step must not sync with the host (sync_guard.py).

Buckets are captured largest first into one memory pool the smaller ones reuse, as vLLM does.
Other steps run eagerly (`replay` answers None; the mixed_graphs room's runner captures more).

The capture backend is pluggable: `CudaGraphCapture` on CUDA, `EagerStandIn` elsewhere, which
runs the step eagerly on the same static buffers under the sync guard, so buckets, padding and
sync-freedom are tested on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .step_inputs import Feed, StepBuffers, step_inputs
from .sync_guard import sync_guard

Step = Callable[[], tuple[torch.Tensor, ...]]


@dataclass
class Captured:
    outputs: tuple[torch.Tensor, ...]  # written by every replay, at fixed addresses
    replay: Callable[[], None]


class CudaGraphCapture:
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

    def capture(self, step: Step) -> Captured:
        with sync_guard():
            outputs = tuple(t.clone() for t in step())

        def replay():
            with sync_guard():
                for static, fresh in zip(outputs, step()):
                    static.copy_(fresh)
        return Captured(outputs, replay)


def with_taps(model, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A captured step's outputs, plus the layers a drafter taps (EAGLE-3) when it taps any."""
    tapped = getattr(model, "tapped", None)
    return outputs + ((tapped,) if tapped is not None else ())


def replayed(model, outputs: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden, logits) of a replay; its taps, if captured, become the model's `tapped` rows."""
    hidden, logits, *tapped = outputs
    if getattr(model, "tap_layers", ()) and not tapped:
        raise RuntimeError("these graphs were captured before a drafter asked for the layers it taps; "
                           "set tap_layers before the first capture")
    if tapped:
        model.tapped = tapped[0][:rows]
    return hidden, logits


def bucket_sizes(max_batch: int, smallest: int = 1) -> list[int]:
    """smallest, 2 * smallest, ... up to max_batch (which is itself a bucket)."""
    sizes, b = [], smallest
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
        self.buffers = StepBuffers(max_batch, max_batch, self.width, dummy_block, self.block_size, model.device)
        self.graphs: dict[int, Captured] = {}

    def capture_all(self) -> None:
        """Every bucket, the largest first: the others reuse its pool."""
        for size in reversed(self.buckets):
            self.graphs[size] = self.capture_backend.capture(lambda size=size: self._step(size))

    def held(self) -> int:
        """How many graphs are captured."""
        return len(self.graphs)

    def fits(self, batch: int, max_seq_len: int) -> bool:
        return batch <= self.buckets[-1] and max_seq_len <= self.max_seq_len

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def _step(self, size: int) -> tuple[torch.Tensor, ...]:
        """The captured function: the decode forward on the first `size` rows of the buffers."""
        meta = self.backend.build_metadata(**self.buffers.views(size, size, self.width), max_query_len=1,
                                           max_seq_len=self.max_seq_len, graphed=True)
        hidden = self.model(self.buffers.input_ids[:size], self.backend, meta)
        return with_taps(self.model, (hidden, self.model.compute_logits(hidden)))

    def replay(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
               feed: Feed | None = None):
        """The step from a captured graph: (hidden of every row, logits of sample_rows), or None
        where no bucket holds it (it runs eagerly). Here: decode steps (every row samples)."""
        if all(n == 1 for _, n, _ in seqs) and self.fits(len(seqs), max(c + n for c, n, _ in seqs)):
            return self.run(token_ids, seqs, feed)
        return None

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
        hidden, logits = replayed(self.model, graph.outputs, n)
        return hidden[:n], logits[:n]
