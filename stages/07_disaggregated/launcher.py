"""Start worker processes and stop them cleanly, whatever happens.

`Topology` is a context manager: it starts P prefill and D decode workers, or N unified workers
(replicas, each running whole requests; they join no KV group), each its own OS process
(`python -m course.s07_disaggregated.worker`), waits until every one answers /health,
and on exit (normal, exception, Ctrl-C) stops them all: SIGTERM first (uvicorn shuts down,
the engine loop stops), SIGKILL if one has not exited after a grace period.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    """A port nobody listens on now (the OS picks it). Another process could take it before we
    bind it; for tests and a local topology that risk is small."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class WorkerProcess:
    role: str
    url: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_worker(role: str, port: int, worker_args: list[str], log_dir: Path, host: str = "127.0.0.1") -> WorkerProcess:
    log_path = log_dir / f"{role}-{port}.log"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "course.s07_disaggregated.worker", "--role", role, "--host", host,
             "--port", str(port), *worker_args],
            stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)  # its own process group: a Ctrl-C in our terminal reaches us, and we stop it
    return WorkerProcess(role, f"http://{host}:{port}", process, log_path)


def wait_healthy(workers: list[WorkerProcess], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(workers)
    while pending:
        for w in list(pending):
            if w.process.poll() is not None:
                raise RuntimeError(f"the {w.role} worker exited with code {w.process.returncode}:\n{w.log_tail()}")
            try:
                if httpx.get(f"{w.url}/health", timeout=2).status_code == 200:
                    pending.remove(w)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"workers not healthy after {timeout_s:.0f} s: " +
                               "; ".join(f"{w.role} {w.url}:\n{w.log_tail()}" for w in pending))
        time.sleep(0.2)


def stop_worker(worker: WorkerProcess, grace_s: float = 10.0) -> None:
    if worker.process.poll() is not None:
        return
    worker.process.send_signal(signal.SIGTERM)
    try:
        worker.process.wait(grace_s)
    except subprocess.TimeoutExpired:
        worker.process.kill()
        worker.process.wait(5)


@dataclass
class Topology:
    """P prefill + D decode workers on this machine, connected by `connector`."""
    model: str | None
    num_prefill: int = 1
    num_decode: int = 1
    connector: str = "p2p"
    worker_args: list[str] = field(default_factory=list)  # passed to every worker (pool size, timeouts)
    log_dir: Path | None = None  # worker logs (and shared_storage's KV files); None: a temporary folder
    startup_timeout_s: float = 120.0
    num_unified: int = 0  # replicas: whole requests each, no transfer (then usually no prefill/decode workers)
    cpus: list[str] | None = None  # per worker, in start order (prefill, decode, unified): "0" or "0,1"
    prefill: list[WorkerProcess] = field(default_factory=list)
    decode: list[WorkerProcess] = field(default_factory=list)
    unified: list[WorkerProcess] = field(default_factory=list)

    def __enter__(self) -> "Topology":
        self._own_dir = self.log_dir is None  # a folder we made ourselves goes when we stop
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="s07-logs-"))
        world = self.num_prefill + self.num_decode
        common = [*(["--model", str(self.model)] if self.model else []), "--connector", self.connector,
                  "--world-size", str(world), "--dist-port", str(free_port()), "--store-port", str(free_port()),
                  *self.worker_args]
        if self.connector == "shared_storage":
            common += ["--kv-dir", str(self.log_dir / "kv")]
        pins = iter(self.cpus or [])
        pin = lambda: ["--cpus", c] if (c := next(pins, None)) else []  # noqa: E731
        try:
            for rank in range(world):
                role = "prefill" if rank < self.num_prefill else "decode"
                worker = start_worker(role, free_port(), [*common, "--rank", str(rank), *pin()], self.log_dir)
                (self.prefill if role == "prefill" else self.decode).append(worker)
            for _ in range(self.num_unified):
                model = ["--model", str(self.model)] if self.model else []
                self.unified.append(start_worker("unified", free_port(), [*model, *self.worker_args, *pin()],
                                                 self.log_dir))
            wait_healthy(self.workers, self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def workers(self) -> list[WorkerProcess]:
        return self.prefill + self.decode + self.unified

    def stop(self) -> None:
        for worker in self.workers:  # SIGTERM all first, so they shut down side by side
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            stop_worker(worker)
        if getattr(self, "_own_dir", False):
            shutil.rmtree(self.log_dir, ignore_errors=True)
