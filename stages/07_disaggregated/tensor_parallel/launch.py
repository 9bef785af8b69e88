"""One process per rank: rank 0 is the caller (engine, scheduler, server), ranks 1..N-1 follow.

Two ways to start them, one code path:

    torch.multiprocessing (default)  TensorParallel.start(spec) spawns ranks 1..N-1 itself
                                     (`spawn`: a fresh interpreter each) and joins them over TCP
    torchrun --nproc-per-node N      torchrun starts N copies of the command; RANK/WORLD_SIZE/
                                     MASTER_ADDR/MASTER_PORT in the environment say who is who;
                                     rank 0 goes on as the server, the others call `run_rank`

Either way every rank runs `run_rank`'s steps: join the group, load the model, cut its shard,
then (ranks > 0) follow rank 0's messages. Rank 0 watches its spawned ranks (a watchdog thread
polls them); a rank that dies breaks the group (channel.py's `fail`). Each spawned rank watches
its parent: if rank 0 disappears, it exits. `close()` stops the others cleanly, and whatever
does not stop within a grace period is killed: no process outlives rank 0.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from course.s01_decode_loop.weights import load_model

from ..launcher import free_port
from .channel import Leader, first_line, follow
from .comm import Collectives, torchrun_rank
from .sharding import shard_model, weight_bytes


@dataclass
class TPSpec:
    """What every rank needs to load the same model the same way."""
    world_size: int
    model: str | None = None    # a folder, a .gguf file, or None for the default model
    dtype: str = "float32"
    device: str = "cpu"         # "cpu": gloo; "cuda": NCCL, rank r on cuda:r
    port: int | None = None     # rank 0's TCP rendezvous port (spawned ranks); None under torchrun
    timeout_s: float = 60.0     # a step's collective that waits longer fails (joining and loading: 300 s)
    threads: int | None = None  # torch threads of each spawned rank (None: torch's default)

    @property
    def init_method(self) -> str | None:
        return None if self.port is None else f"tcp://127.0.0.1:{self.port}"


def load_shard(spec: TPSpec, comm: Collectives):
    """(the loaded model, this rank's shard of it, the whole model's weight bytes): the whole
    model is read, then cut in place."""
    loaded = load_model(spec.model, dtype=getattr(torch, spec.dtype), device=str(comm.device))
    whole = weight_bytes(loaded.model)
    return loaded, shard_model(loaded.model, comm), whole


def run_rank(spec: TPSpec, rank: int) -> None:
    """Ranks 1..N-1, started by spawn or torchrun: join, load, follow until told to stop."""
    # A terminal's Ctrl-C reaches every process of the group: rank 0 handles it (drain, then "stop"
    # to the others); a follower that died of it first would fail the steps rank 0 is draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if torchrun_rank() is None:
        threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    comm = Collectives.join(rank, spec.world_size, spec.device, spec.init_method, spec.timeout_s)
    try:
        _, model, _ = load_shard(spec, comm)
        follow(model, comm)
    except Exception as e:  # rank 0 went away, or a collective timed out: nothing left to follow
        print(f"tensor parallel rank {rank}: {first_line(e)}", file=sys.stderr, flush=True)
        os._exit(1)  # a broken group cannot be left politely (destroy would wait on the dead peer)
    # Told to stop: leave the group, then end.
    comm.leave()
    exit_now(0)


def exit_now(code: int) -> None:
    """End this process without the interpreter's teardown, which can destroy gloo's still-running
    C++ threads and abort the process ("terminate called without an active exception") after
    the work is done; what it printed is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class TensorParallel:
    """Rank 0's handle on the group: start it, cut a model, attach an engine, close it."""

    def __init__(self, spec: TPSpec, comm: Collectives, processes: list, on_failure=lambda reason: None):
        self.spec, self.comm, self.processes = spec, comm, processes
        self.whole_weight_bytes = 0  # set by load_shard
        self.leader = Leader(comm, heartbeat_s=spec.timeout_s / 3, on_failure=on_failure)
        self._closing = threading.Event()
        threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()

    @classmethod
    def start(cls, spec: TPSpec, on_failure=lambda reason: None) -> "TensorParallel":
        """Spawn ranks 1..N-1 (unless torchrun started them) and join them as rank 0."""
        processes = []
        if torchrun_rank():
            raise ValueError("TensorParallel.start is rank 0's; torchrun's other ranks call run_rank")
        if torchrun_rank() is None:
            spec.port = spec.port or free_port()
            context = mp.get_context("spawn")
            for rank in range(1, spec.world_size):
                p = context.Process(target=run_rank, args=(spec, rank), name=f"tp-rank-{rank}", daemon=True)
                p.start()
                processes.append(p)
        try:
            comm = Collectives.join(0, spec.world_size, spec.device, spec.init_method, spec.timeout_s)
        except BaseException:
            _stop(processes, grace_s=0)
            raise
        return cls(spec, comm, processes, on_failure)

    def load_shard(self):
        """Rank 0's loaded model (tokenizer, EOS ids) with its model cut to shard 0."""
        loaded, model, self.whole_weight_bytes = load_shard(self.spec, self.comm)
        return loaded, model

    def attach(self, engine, log=lambda line: print(line, file=sys.stderr, flush=True)) -> list[dict]:
        reports = self.leader.attach(engine)
        for r in reports:
            log(f"tensor parallel rank {r['rank']} of {self.comm.world_size}: weights {r['weight_bytes'] / 2**20:.2f} MiB "
                f"(whole model {self.whole_weight_bytes / 2**20:.2f} MiB), KV pool {r['kv_bytes'] / 2**20:.2f} MiB "
                f"(1/{self.comm.world_size} of the KV heads)")
        return reports

    def close(self) -> None:
        """Stop the other ranks (politely if the group works), then reap or kill them."""
        self._closing.set()
        self.leader.stop()
        _stop(self.processes, grace_s=10)
        self.comm.leave()

    def __enter__(self) -> "TensorParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _watch(self) -> None:
        while not self._closing.wait(0.2):
            for rank, p in enumerate(self.processes, start=1):
                if p.exitcode is not None and not self._closing.is_set():
                    self.leader.fail(f"rank {rank} exited with code {p.exitcode}")
                    return


def _stop(processes: list, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(5)
