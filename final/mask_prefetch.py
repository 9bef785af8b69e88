"""Grammar masks for the batch, filled on a worker thread while the forward pass runs.

A constrained request's mask depends only on the tokens it has so far, not on this step's
logits, so it can be computed *during* the forward instead of after it (GPU engines fill the
batch's bitmask on the CPU while the GPU computes). Each request's grammar (stage 08's
GrammarLogitsProcessor) gets its `prepare(output_ids)` called here for the step's first sampling
row; when sampling then calls the processor, the mask is ready.

The engine thread waits for the worker before it samples, so a processor is never used by two
threads at once. A processor that fails here is left alone: the same failure happens again
when the engine calls it, and fails that request alone, as it would without prefetching.

On this CPU the forward's matmuls release the GIL, so the two overlap; the overlap is worth a
mask's time per constrained request per step (~0.1-0.2 ms each), small next to a CPU forward.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor



class MaskPrefetcher:
    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="masks")

    def start(self, chunks: list) -> Future | None:
        """Begin filling the masks of every request in `chunks` ((ServedRequest, rows) pairs)
        that samples this step."""
        jobs = [(req.grammar.prepare, list(req.seq.output_ids)) for req, n in chunks
                if req.grammar is not None
                and req.num_computed_tokens + n >= req.num_tokens]  # caught up: it samples this step
        return self._pool.submit(self._fill, jobs) if jobs else None

    @staticmethod
    def _fill(jobs) -> None:
        for prepare, output_ids in jobs:
            try:
                prepare(output_ids)
            except Exception:  # noqa: BLE001 - raised again, for this request alone, when it samples
                pass

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
