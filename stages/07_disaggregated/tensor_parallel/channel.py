"""Rank 0 drives, the other ranks follow: one broadcast per step, then the same forward everywhere.

    rank 0 (scheduler, sampler, server)          ranks 1..N-1 (`follow`)
    engine.step(): schedule                       wait for a message
      runner.run(ids, seqs, rows) ─ broadcast ─►  ("run", ids, seqs, rows)
      forward on shard 0  ◄── all-reduces, all-gather ──►  forward on shard r (own KV pool)
      sample from the full logits                 (drop them)

A step's whole description is stage 06's `ModelRunner.run` arguments: token ids, (cached, new,
block table) per sequence and the sampling rows, a few hundred integers. Every rank's block
manager would make the same choices, but only rank 0 keeps one: the others write their KV heads
into the blocks rank 0 names. Messages: ("engine", config) builds a rank's engine (its runner and
KV pool), ("run", ...) one forward, ("logits", hidden) a gather outside a step (prompt logprobs),
("ping",) keeps an idle group inside its timeouts, ("stop",) ends it.

Rank 0's collectives happen under one lock, from the engine's thread or the heartbeat's, so a
heartbeat never lands between a step's broadcast and its all-reduces. A collective that fails
(a rank died, or the timeout passed) breaks the group: every later step fails at once with
TensorParallelError, and the `on_failure` callback runs (the server uses it to exit).
"""
from __future__ import annotations

import contextlib
import re
import sys
import threading
import time

from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

from .comm import Collectives, TensorParallelError
from .sharding import weight_bytes


def check_engine_config(config: KernelEngineConfig) -> None:
    """TP runs the model's plain torch forward: refuse what would replace or capture it."""
    refused = {"fused": "the fused model (and the CPU's one-call C layers built on it) merges the linears "
                        "this code splits",
               "cuda_graphs": "captured graphs would replay the collectives without the step's broadcast",
               "overlap": "overlap launches a step whose token ids rank 0 has not read, so it cannot send them"}
    for name, why in refused.items():
        if getattr(config, name):
            raise ValueError(f"tensor parallelism does not support {name}=True: {why}")
    if config.attention_backend not in ("torch", "triton"):
        raise ValueError(f"tensor parallelism runs attention through 'torch' (or 'triton' on CUDA), not "
                         f"{config.attention_backend!r}: the CPU's C kernel comes with the fused layers it cannot split")


def memory_report(engine: LLMEngine, comm: Collectives) -> dict:
    return {"rank": comm.rank, "weight_bytes": weight_bytes(engine.model), "kv_bytes": engine.cache.nbytes}


class Leader:
    """Rank 0's end of the channel."""

    def __init__(self, comm: Collectives, heartbeat_s: float = 10.0, on_failure=lambda reason: None):
        self.comm, self.on_failure = comm, on_failure
        self.lock = threading.RLock()
        self._stepping: int | None = None  # the thread inside a step (engine or heartbeat), if any
        self.broken: str | None = None
        self._last_sent = time.monotonic()
        self._closing = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, args=(heartbeat_s,), name="tp-heartbeat", daemon=True)
        self._heartbeat.start()

    @property
    def in_step(self) -> bool:
        """Is the calling thread inside a step (so its collectives are already announced)?"""
        return self._stepping == threading.get_ident()

    @contextlib.contextmanager
    def step(self, message):
        """Send `message`, then run the body (its collectives) with the group held."""
        with self.lock:
            if self.broken:
                raise TensorParallelError(self.broken)
            self._stepping = threading.get_ident()
            try:
                self.comm.broadcast(message)
                self._last_sent = time.monotonic()
                yield
            except TensorParallelError:
                raise
            except Exception as e:  # gloo/NCCL: a peer closed its connection, or the timeout passed
                self.fail(f"a collective failed: {first_line(e)}")
                raise TensorParallelError(self.broken) from e
            finally:
                self._stepping = None

    def fail(self, reason: str) -> None:
        """Mark the group broken (once) and tell whoever must know (the watchdog calls it too)."""
        if self.broken is None:
            self.broken = f"tensor parallel group failed: {reason}"
            print(f"error: {self.broken}", file=sys.stderr, flush=True)
            self.on_failure(self.broken)

    def attach(self, engine: LLMEngine) -> list[dict]:
        """Make `engine` (rank 0's, built on shard 0) drive the others: every rank builds the same
        runner and pool, and each step goes through the channel. Returns every rank's memory."""
        check_engine_config(engine.config)
        with self.step(("engine", engine.config)):
            reports = self.comm.all_gather_object(memory_report(engine, self.comm))
        self.comm.use_step_timeout()  # every rank is loaded and built: steps are short from here
        engine.runner = BroadcastingRunner(engine.runner, self)
        engine.model.lm_head.leader = self
        return reports

    def stop(self) -> None:
        """Tell the other ranks to leave their loop (if the group still works)."""
        self._closing.set()
        if self.broken is None:
            with contextlib.suppress(TensorParallelError), self.step(("stop",)):
                pass

    def _beat(self, every_s: float) -> None:
        while not self._closing.wait(every_s / 4):
            if self.broken is None and time.monotonic() - self._last_sent > every_s and self.lock.acquire(timeout=0):
                try:
                    with contextlib.suppress(TensorParallelError), self.step(("ping",)):
                        pass
                finally:
                    self.lock.release()


def first_line(e: Exception) -> str:
    """An exception's first line, without gloo's "[file.cc:123] " prefix."""
    return type(e).__name__ + ": " + re.sub(r"^\[[^\]]*\] ", "", (str(e).splitlines() or [""])[0])[:200]


class BroadcastingRunner:
    """Stage 06's ModelRunner on rank 0, each `run` announced to the other ranks first."""

    def __init__(self, runner, leader: Leader):
        self.runner, self.leader = runner, leader

    def run(self, token_ids, seqs, sample_rows, feed=None, trees=None, groups=None):
        if feed is not None:
            raise TensorParallelError("overlap feeds token ids rank 0 has not read; tensor parallelism cannot send them")
        # speculative trees and layer groups' tables too, where there are any
        message = ("run", token_ids, seqs, sample_rows) + ((None, trees, groups) if trees or groups else ())
        with self.leader.step(message):
            return self.runner.run(token_ids, seqs, sample_rows, None, trees, groups)

    def __getattr__(self, name):  # graphs, model, prepare, ...: the runner's own
        return getattr(self.runner, name)


def follow(model, comm: Collectives) -> None:
    """Ranks 1..N-1: obey rank 0's messages until ("stop",). Raises if a collective fails."""
    engine = None
    while True:
        message = comm.broadcast()
        kind = message[0]
        if kind == "engine":
            engine = LLMEngine(model, None, message[1])
            comm.all_gather_object(memory_report(engine, comm))
            comm.use_step_timeout()
        elif kind == "run":
            engine.runner.run(*message[1:])
        elif kind == "logits":
            model.compute_logits(message[1].to(comm.device))
        elif kind == "stop":
            return
        # ("ping",): nothing to do; it only kept this wait inside the group's timeout
