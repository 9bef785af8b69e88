"""Graceful shutdown: SIGTERM or Ctrl-C drains the server instead of dropping its requests.

1. The first signal stops admission: new requests get 503 (and /health says 503, so a load
   balancer stops sending), schema compiles in progress are cancelled.
2. Requests in flight keep running, for up to `drain_timeout` seconds.
3. Whatever is still running then ends with a clear error (an error event in a stream, a 503
   otherwise), uvicorn closes the connections, and the process exits with status 0.
A second signal skips the rest of the wait; a third makes uvicorn quit at once.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import uvicorn

from .engine_client import EngineClient

log = logging.getLogger("uvicorn.error")


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: EngineClient, drain_timeout: float,
                 on_drain: Callable[[], None] = lambda: None):
        super().__init__(config)
        self.engine, self.drain_timeout, self.on_drain = engine, drain_timeout, on_drain
        self._draining: threading.Thread | None = None
        self._hurry = threading.Event()

    def handle_exit(self, sig, frame) -> None:  # runs in the signal handler: only set flags here
        if self._draining is None:
            self.engine.accepting = False
            self._draining = threading.Thread(target=self._drain, name="drain", daemon=True)
            self._draining.start()
        elif not self.should_exit:
            self._hurry.set()
        else:
            self.force_exit = True
        # Not recorded in _captured_signals: uvicorn would re-raise it after a clean exit.

    def _drain(self) -> None:
        self.on_drain()
        log.info("Draining: admitting nothing new; requests in flight get up to %g s (signal again to stop "
                 "them now)", self.drain_timeout)
        stopped = self.engine.drain(self.drain_timeout, hurry=self._hurry)
        if stopped:
            log.warning("Drain: stopped %d unfinished request(s)", stopped)
        self.should_exit = True


def serve_until_stopped(app, engine, host: str, port: int, drain_timeout: float, **uvicorn_options) -> None:
    """Serve `app` until Ctrl-C or SIGTERM, drain, then stop schema compiles and the engine (its
    thread, or the remote workers' streams): what both `serve` paths do once their engine is up."""
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5, **uvicorn_options)
    server = GracefulServer(config, engine, drain_timeout, on_drain=app.state.grammars.cancel_all)
    try:
        server.run()
    finally:
        app.state.grammars.cancel_all()
        engine.shutdown()
