"""Run step N+1 on the device while the host post-processes step N.

A synchronous step keeps the device idle while the host works:

    host    schedule | launch N |  (wait)  | read tokens, detokenize, stop | schedule | launch N+1
    device           |   forward + sample N |                              |          | forward N+1

In a steady decode batch nothing the host needs to launch step N+1 depends on step N's token
values: positions, sequence lengths, slot mappings and block tables only advance by one. Only
the input ids do, and those are already on the device. So this scheduler launches N+1 first
and post-processes N while the device runs it:

    host    schedule | launch N+1 (ids fed from N's samples on the device) | read N's tokens ...
    device  forward N+1 ...

How the host keeps its books without N's tokens: at launch every request's computed count
advances and its sequence *reserves* a place for the token in flight (`Sequence.reserve`), so
the scheduler sees an ordinary decode; the model runner's `feed` copies the reserved rows' ids
from the previous step's sampled tensor, device to device. The sampled ids travel to the host
on a side stream behind an event, and `resolve` appends them (detokenize, stop checks, prefix
cache commits). A request that finished at N (an EOS no one could predict) wastes its row at
N+1, whose token is dropped; an aborted one the same.

Only steady steps are deferred: every row a plain decode whose token the device can draw alone
(no logits processors such as a grammar, no penalties, no logprobs: each reads the host's view
of the request), no drafts, nothing waiting, enough free blocks for every row's next token and
no request at its token limit. Anything else first resolves the step in flight, then runs the
synchronous step: stage 04's path, unchanged. On the CPU the device is the host, so nothing
overlaps, but the same code runs, and the equivalence tests hold it to the synchronous engine
token for token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s04_continuous_batching.batch_sampler import sample_tokens, samples_on_device, to_device
from course.s04_continuous_batching.engine import StepOutput
from course.s04_continuous_batching.request import Request

from ..engine import Extension


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read: row i samples for chunks[i]."""
    chunks: list[tuple[Request, int]]
    tokens: torch.Tensor                  # [rows] sampled ids, on the device
    host: torch.Tensor                    # their copy on the host (pinned on CUDA), valid once `ready` fires
    ready: torch.cuda.Event | None        # None on the CPU: the copy is done when issued
    rows: dict[int, int]                  # request id -> its row


class OverlapScheduler(Extension):
    """The engine's step, run ahead where it can (`KernelEngineConfig.overlap`)."""

    def __init__(self, engine):
        self.engine = engine
        self.inflight: InFlight | None = None
        self.side = torch.cuda.Stream(engine.model.device) if engine.model.device.type == "cuda" else None
        self.deferred_steps = 0  # steps launched before the previous one was read

    @classmethod
    def of(cls, engine) -> "OverlapScheduler | None":
        return cls(engine) if engine.config.overlap else None

    def in_flight(self) -> bool:
        return self.inflight is not None

    def stats(self) -> dict:
        return {"overlapped_steps": self.deferred_steps}

    def step(self) -> list[StepOutput]:
        engine, outputs = self.engine, []
        if self.inflight is not None and not self.steady():
            outputs += self.resolve()
        chunks = engine._schedule()
        if not chunks:
            return outputs + self.resolve()
        if self.deferrable(chunks):
            launched = self.launch(chunks)
            outputs += self.resolve()  # the host's work for step N, while the device runs N+1
            self.inflight = launched
            return outputs
        outputs += self.resolve()  # the synchronous step needs every token on the host
        chunks = [(req, n) for req, n in chunks if not req.finished]
        return outputs + (engine._postprocess(chunks, engine._run(chunks)) if chunks else [])

    # ---- when to defer --------------------------------------------------------------------
    def steady(self) -> bool:
        """Will the next schedule be plain decodes of the running requests, with room for all?"""
        engine = self.engine
        scheduler, blocks = engine.scheduler, engine.blocks
        if scheduler.waiting or not engine.overlap_allowed():
            return False
        needed = 0
        for req in scheduler.running:
            seq = req.seq
            in_flight = req.num_tokens - len(seq.prompt_ids) - len(seq.output_ids)
            if (req.num_uncomputed != 1 or not samples_on_device(seq)
                    or len(seq.output_ids) + in_flight + 1 > seq.params.max_new_tokens):
                return False  # prefilling, needs the host's view of its tokens, or at its last token
            needed += blocks.blocks_needed(req.num_tokens) > len(blocks.tables[req.request_id])
        return needed <= blocks.num_free_blocks

    def deferrable(self, chunks: list[tuple[Request, int]]) -> bool:
        return self.engine.overlap_allowed() and all(
            n == 1 and req.num_uncomputed == 1 and samples_on_device(req.seq) for req, n in chunks)

    # ---- launch and resolve ---------------------------------------------------------------
    def launch(self, chunks: list[tuple[Request, int]]) -> InFlight:
        """Forward and sample on the device; start the ids' copy to the host; advance the books."""
        engine = self.engine
        logits = engine._run(chunks, self.feed(chunks))
        work = logits.to(torch.float32, copy=True)  # what stage 04's sample_batch samples from
        tokens = sample_tokens(work, [req.seq for req, _ in chunks], engine.unseeded_generator)
        host, ready = tokens, None
        if self.side is not None:
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                host.copy_(tokens, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
            tokens.record_stream(self.side)
        for req, _ in chunks:
            req.num_computed_tokens += 1  # its input token's K/V is being written
            req.seq.reserve()             # and its next token is being drawn
        self.deferred_steps += self.inflight is not None
        return InFlight(chunks, tokens, host, ready, {req.request_id: i for i, (req, _) in enumerate(chunks)})

    def feed(self, chunks: list[tuple[Request, int]]):
        """(rows, ids) of this step's rows whose input token is the step in flight's sample."""
        if self.inflight is None:
            return None
        mine = [(row, self.inflight.rows[req.request_id]) for row, (req, _) in enumerate(chunks)
                if req.request_id in self.inflight.rows]
        if not mine:
            return None
        rows, sources = zip(*mine)
        device = self.inflight.tokens.device
        if list(sources) == list(range(len(sources))):  # same order (the usual case): no gather
            values = self.inflight.tokens[:len(sources)]
        else:
            values = self.inflight.tokens.index_select(0, to_device(list(sources), torch.long, device))
        return to_device(list(rows), torch.long, device), values

    def resolve(self) -> list[StepOutput]:
        """Read the step in flight's tokens and post-process them (stage 04's per-request work)."""
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            return []
        engine, outputs = self.engine, []
        if inflight.ready is not None:
            inflight.ready.synchronize()
        for (req, _), token in zip(inflight.chunks, inflight.host.tolist()):
            if req.finished:  # it finished a step earlier (or was aborted): this row was wasted
                continue
            event = req.seq.append(token)
            if req.request_id in engine.blocks.tables:  # name the blocks whose ids are all known now
                known = len(req.seq.prompt_ids) + len(req.seq.output_ids)
                engine.blocks.commit(req.request_id, req.all_ids, min(req.num_computed_tokens, known))
            outputs.append(StepOutput(req.request_id, event))
            if event.finish_reason:
                req.finish_reason = event.finish_reason
                engine.scheduler.finish(req)
        return outputs
