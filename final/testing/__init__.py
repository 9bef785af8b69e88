"""Test tools for the server: a tiny engine, a live server on a free localhost port, and a
reader for /metrics. The tests (and anyone poking at the server from a notebook) use these."""
from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from course.s01_decode_loop.testing import tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

from ..async_engine import AsyncEngine
from ..cli import assemble_app
from ..engine import Engine, SpeculativeConfig
from ..metrics import ServerMetrics
from ..server import ServerLimits
from ..shutdown import GracefulServer

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli_server(*args: str) -> tuple[subprocess.Popen, str]:
    """`python -m course.final serve ARGS` in its own process on a free port, once /health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "course.final", "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # the default model may need converting on a fresh machine
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server never answered /health")


def stop_cli_server(proc: subprocess.Popen) -> int:
    """Ctrl-C (uvicorn shuts down cleanly); its exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    finally:
        proc.kill()


def tiny_engine(byte_tok, speculative: SpeculativeConfig | None = None, policy=None, model: str = "gqa_tied",
                **config) -> AsyncEngine:
    """A random-weight model behind the engine thread: 64 blocks of 4 tokens, `config` on top;
    `policy`: a scheduling policy (default FCFS); `model`: which of stage 01's tiny configs."""
    byte_tok.chat_template = CHAT_TEMPLATE
    llm = Engine(tiny_model(model), byte_tok, KernelEngineConfig(**({"num_blocks": 64, "block_size": 4} | config)),
                 [byte_tok.eos_token_id], speculative, policy=policy)
    return AsyncEngine(llm, ServerMetrics("tiny"))


@contextlib.contextmanager
def running_server(engine: AsyncEngine, tokenizer, model_name: str = "tiny", limits: ServerLimits | None = None,
                   drain_timeout: float = 5.0, door=None, app=None):
    """The full app (cli.py's assemble_app, every room plugged in) on a free localhost port, served
    by uvicorn in a thread, as a user would run it. Yields (base URL, the GracefulServer:
    `server.handle_exit(signal.SIGTERM, None)` is what a SIGTERM does); stops the server and the
    engine on exit. `door`: API keys (security/). `app`: one built already (cli.build_server's)."""
    if app is None:  # the plug-ins hook in before the engine runs
        app = assemble_app(engine, tokenizer, model_name, limits, door)
    engine.start()
    srv = GracefulServer(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                        timeout_graceful_shutdown=2),
                         engine, drain_timeout, on_drain=app.state.grammars.cancel_all)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if srv.started:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the test server did not start")
        yield f"http://127.0.0.1:{srv.config.port}", srv
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        app.state.grammars.cancel_all()
        engine.shutdown()


@contextlib.contextmanager
def live_server(engine: AsyncEngine, tokenizer, model_name: str = "tiny", limits: ServerLimits | None = None):
    """`running_server`, yielding only the base URL."""
    with running_server(engine, tokenizer, model_name, limits) as (url, _):
        yield url


def metric(url: str, name: str, default: float | None = None, **labels) -> float:
    """One sample's value from GET /metrics, e.g. metric(url, "vllm:num_requests_running");
    `default` for a labelled sample not seen yet (a counter that has not counted)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    if default is not None:
        return default
    raise KeyError(name)
