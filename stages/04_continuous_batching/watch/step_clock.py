"""What the dashboard learns from each step while someone watches, and nothing while no one does.

The engine does not time its phases: a server must not pay for a clock nobody reads. So while
the page is open, `StepClock.install` wraps the engine's own methods on the instance, the way
bench/profile.py times them, and `remove` deletes the wrappers, leaving the class's methods:

    step         the whole step (its time, the tokens it emitted)
    _propose     draft: the drafter's guesses (the final engine, when speculating)
    _schedule    schedule: the scheduler's (request, tokens) pairs; the rows of the batch are read here
    _run         forward: the model over the ragged batch (grammar masks filled meanwhile)
    _postprocess sample: sampling, verification, detokenizing, finishing
    scheduler.preempt   the victim and the blocks it frees

Everything lands in a `StepWindow`, which the next snapshot reads and empties. On the CPU every
op is synchronous, so a wall clock around a call is its cost; on a GPU the forward is launched
asynchronously and its time shows partly in `sample`, where the host first waits for its logits.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

PHASES = {"_propose": "draft", "_schedule": "schedule", "_run": "forward", "_postprocess": "sample"}


@dataclass
class Row:
    """One request's share of the last step it ran in."""
    kind: str          # "prefill" (a prompt chunk, or a recompute after preemption) or "decode"
    tokens: int        # rows of the batch it took
    drafted: int       # draft tokens among them
    start: int         # its computed tokens before the step
    accepted: int = 0  # drafts the target kept (filled after the step)


@dataclass
class StepWindow:
    """The steps since the last snapshot (reset by it), and the latencies of recent requests."""
    steps: int = 0
    step_s: float = 0.0
    phase_s: dict = field(default_factory=lambda: dict.fromkeys(PHASES.values(), 0.0))
    batched_tokens: int = 0
    emitted_tokens: int = 0
    rows: dict = field(default_factory=dict)  # request id -> Row of its last step
    preempted_ids: list = field(default_factory=list)
    preempted_blocks: set = field(default_factory=set)
    started: float = field(default_factory=time.perf_counter)
    ttft_s: deque = field(default_factory=lambda: deque(maxlen=512))  # kept across windows
    tpot_s: deque = field(default_factory=lambda: deque(maxlen=512))
    _timed_first: set = field(default_factory=set)  # requests whose first token is counted

    def reset(self) -> None:
        self.steps, self.step_s, self.batched_tokens, self.emitted_tokens = 0, 0.0, 0, 0
        self.phase_s = dict.fromkeys(self.phase_s, 0.0)
        self.preempted_ids, self.preempted_blocks = [], set()
        self.started = time.perf_counter()

    def forget_gone(self, alive) -> None:
        """Drop what is kept of requests that ended outside a step (aborted while queued)."""
        self._timed_first &= alive.keys()
        self.rows = {rid: row for rid, row in self.rows.items() if rid in alive}

    def scheduled(self, engine, chunks) -> None:
        drafts = getattr(engine, "drafts", {})
        self.rows = {}
        for req, n in chunks:
            drafted = len(drafts.get(req.request_id, ()))
            decode = n - drafted == 1 and req.num_uncomputed == 1
            self.rows[req.request_id] = Row("decode" if decode else "prefill", n, drafted, req.num_computed_tokens)
            self.batched_tokens += n

    def stepped(self, engine, outputs, seconds: float) -> None:
        self.steps += 1
        self.step_s += seconds
        self.emitted_tokens += sum(out.event is not None for out in outputs)
        for rid, row in self.rows.items():
            req = engine.requests.get(rid)
            if req is None:
                continue
            if row.drafted:  # the last real token and the kept drafts advanced it
                row.accepted = max(0, min(row.drafted, req.num_computed_tokens - row.start - 1))
            times = req.seq.token_times
            if times and rid not in self._timed_first:
                self._timed_first.add(rid)
                self.ttft_s.append(times[0])
            if req.finished:
                self._timed_first.discard(rid)
                if len(times) > 1:
                    self.tpot_s.append((times[-1] - times[0]) / (len(times) - 1))


class StepClock:
    """The wrappers around one engine's methods (see the module doc)."""

    def __init__(self, engine, window: StepWindow):
        self.engine, self.window = engine, window

    def install(self) -> "StepClock":
        engine, window = self.engine, self.window
        for name, phase in PHASES.items():
            if hasattr(engine, name):
                setattr(engine, name, self._timed(getattr(engine, name), phase, name == "_schedule"))
        step = engine.step

        def timed_step():
            t = time.perf_counter()
            outputs = step()
            window.stepped(engine, outputs, time.perf_counter() - t)
            return outputs
        engine.step = timed_step
        preempt = engine.scheduler.preempt

        def noted_preempt(req):
            window.preempted_blocks.update(engine.blocks.tables.get(req.request_id, ()))
            window.preempted_ids.append(req.request_id)
            preempt(req)
        engine.scheduler.preempt = noted_preempt
        return self

    def remove(self) -> None:
        """Back to the class's methods: no wrapper left on the step."""
        for name in [*PHASES, "step"]:
            self.engine.__dict__.pop(name, None)
        self.engine.scheduler.__dict__.pop("preempt", None)

    def _timed(self, method, phase: str, reads_batch: bool):
        window, engine = self.window, self.engine

        def timed(*args, **kwargs):
            t = time.perf_counter()
            result = method(*args, **kwargs)
            window.phase_s[phase] += time.perf_counter() - t
            if reads_batch:
                window.scheduled(engine, result)
            return result
        return timed
