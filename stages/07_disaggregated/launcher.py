"""Start worker processes and stop them cleanly, whatever happens.

`Topology` is a context manager: it starts P prefill and D decode workers, or N unified workers
(replicas, each running whole requests; they join no KV group), each its own OS process
(`python -m course.s07_disaggregated worker`), waits until every one answers /health,
and on exit (normal, exception, Ctrl-C) stops them all: SIGTERM first (uvicorn shuts down,
the engine loop stops), SIGKILL if one has not exited after a grace period.

The launcher binds every port itself (port 0: the OS picks a free one) and hands the bound
socket to the worker, which inherits it. Picking a free port and letting the worker bind it
later would leave a window, the seconds a worker spends loading its model, in which another
process (another worker's gloo connections, say) can take the port.
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
    bind it: fine where the bind follows at once; a worker that loads a model first gets a bound
    socket instead (`bound_socket`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a port the OS picked, ours until we close it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


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


def start_worker(role: str, worker_args: list[str], log_dir: Path, host: str = "127.0.0.1",
                 inherit: tuple[socket.socket, ...] = ()) -> WorkerProcess:
    """Start one worker on a socket bound here (--fd); `inherit`: more bound sockets it is handed
    (their --dist-fd is in worker_args). The child holds its own copies; ours are closed."""
    http = bound_socket(host)
    port = http.getsockname()[1]
    log_path = log_dir / f"{role}-{port}.log"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "course.s07_disaggregated", "worker", "--role", role, "--host", host,
                 "--fd", str(http.fileno()), *worker_args],
                stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=[http.fileno(), *(s.fileno() for s in inherit)],
                start_new_session=True)  # its own process group: a Ctrl-C in our terminal reaches us, and we stop it
    finally:
        http.close()
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


def stop_worker(worker: WorkerProcess, grace_s: float = 10.0, signalled: bool = False) -> None:
    """SIGTERM (unless `signalled`: sent already), then SIGKILL after `grace_s`. One SIGTERM only:
    a second one can land while the worker's Python is exiting, and kill it mid-cleanup."""
    if worker.process.poll() is not None:
        return
    if not signalled:
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
        rendezvous = bound_socket()  # rank 0 hosts it; the others connect to its port
        common = [*(["--model", str(self.model)] if self.model else []), "--connector", self.connector,
                  "--world-size", str(world), "--dist-port", str(rendezvous.getsockname()[1]), *self.worker_args]
        if self.connector == "shared_storage":
            common += ["--kv-dir", str(self.log_dir / "kv")]
        pins = iter(self.cpus or [])
        pin = lambda: ["--cpus", c] if (c := next(pins, None)) else []  # noqa: E731
        try:
            for rank in range(world):
                role = "prefill" if rank < self.num_prefill else "decode"
                hosts = rank == 0 and self.connector == "p2p"
                args = [*common, "--rank", str(rank), *(["--dist-fd", str(rendezvous.fileno())] if hosts else [])]
                worker = start_worker(role, [*args, *pin()], self.log_dir, inherit=(rendezvous,) if hosts else ())
                (self.prefill if role == "prefill" else self.decode).append(worker)
            for _ in range(self.num_unified):
                model = ["--model", str(self.model)] if self.model else []
                self.unified.append(start_worker("unified", [*model, *self.worker_args, *pin()], self.log_dir))
            wait_healthy(self.workers, self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        finally:
            rendezvous.close()  # rank 0 holds its own copy
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
            stop_worker(worker, signalled=True)
        if getattr(self, "_own_dir", False):
            shutil.rmtree(self.log_dir, ignore_errors=True)
