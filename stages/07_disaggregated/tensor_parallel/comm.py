"""The collectives tensor parallelism needs, counted: all-reduce, all-gather, broadcast.

Every rank runs the same forward on its slice of the weights; these calls are where the slices
meet. Each one is counted (calls and bytes) so a test can assert how many a step makes and the
benchmark can say how many bytes a step moves. One process group per process: gloo on the CPU,
NCCL on CUDA, joined through a TCP address (spawned ranks) or torchrun's environment.
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist

from course.s01_decode_loop.bench.measure import sync


class TensorParallelError(RuntimeError):
    """A rank died, or a collective failed or ran past its timeout: the group cannot go on."""


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it (RANK and WORLD_SIZE are set), else None."""
    return int(os.environ["RANK"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else None


class Collectives:
    """This rank's view of the group: rank, world size, device, and the counted collectives."""

    def __init__(self, rank: int, world_size: int, device: str = "cpu", timeout_s: float = 60.0):
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.timeout_s = timeout_s           # the steps' collective timeout (use_step_timeout)
        self.calls: Counter = Counter()      # "all_reduce" -> how many
        self.bytes: Counter = Counter()      # "all_reduce" -> payload bytes this rank contributed
        self.seconds: Counter = Counter()    # time spent inside them, when `timing` (the benchmark) is on
        self.timing = False

    @classmethod
    def join(cls, rank: int, world_size: int, device: str = "cpu", init_method: str | None = None,
             timeout_s: float = 60.0, startup_timeout_s: float = 300.0) -> "Collectives":
        """Join the group (blocks until every rank has, or raises after `startup_timeout_s`: a
        spawned interpreter takes seconds to start). Loading the model and building the engines
        get as long, since a rank that loads slower keeps the others waiting in their first
        collective; `use_step_timeout` then shortens it to `timeout_s`. A CUDA device becomes
        cuda:<rank> (one GPU per rank). `init_method` None: torchrun's env://."""
        if device.startswith("cuda"):
            device = f"cuda:{rank}"
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", init_method=init_method or "env://",
                                rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=max(timeout_s, startup_timeout_s)))
        return cls(rank, world_size, device, timeout_s)

    def use_step_timeout(self) -> None:
        """Every rank has its shard and its engine: from now on a collective that waits longer than
        `timeout_s` fails (a step is short; a wait that long means a rank is stuck or gone)."""
        if dist.is_initialized():
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=self.timeout_s))  # torch's own setter (private)

    def count(self, op: str, t: torch.Tensor) -> None:
        self.calls[op] += 1
        self.bytes[op] += t.numel() * t.element_size()

    def reset_counts(self) -> None:
        self.calls.clear()
        self.bytes.clear()
        self.seconds.clear()

    def _timed(self, op: str, fn, *args):
        if not self.timing:
            return fn(*args)
        sync(self.device)
        start = time.perf_counter()
        out = fn(*args)
        sync(self.device)
        self.seconds[op] += time.perf_counter() - start
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place (every rank holds the sum)."""
        if self.world_size > 1:
            self.count("all_reduce", x)
            self._timed("all_reduce", dist.all_reduce, x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x side by side along the last dimension (rank 0's first)."""
        if self.world_size == 1:
            return x
        self.count("all_gather", x)
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._timed("all_gather", dist.all_gather, parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, message=None):
        """Rank 0's picklable `message` to every rank; each gets it back (others pass nothing)."""
        box = [message]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @staticmethod
    def leave(timeout_s: float = 5.0) -> None:
        """Leave the group; a broken one may never answer, so give up waiting after `timeout_s`."""
        if dist.is_initialized():
            closer = threading.Thread(target=dist.destroy_process_group, daemon=True)
            closer.start()
            closer.join(timeout_s)
