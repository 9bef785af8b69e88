"""The front server `serve` runs when it has no prompts: one route in front of the workers.

  GET  /health    the workers and the router's picture (policy, prefix hit rate, dead workers)
  POST /generate  {"prompt" or "prompt_ids", "sampling"} -> the whole answer as one JSON object

It answers once, at the end (no token stream): a plain `def` route that FastAPI runs on a thread,
where the dispatcher's blocking client is fine. A streaming front would pass the dispatcher a
`cancel` Event and set it when its client disconnects (see Dispatcher.stream).
"""
from __future__ import annotations

import httpx

from .dispatcher import Dispatcher, WorkerDied
from .router import NoAliveWorkerError


def build_front_app(dispatcher: Dispatcher, tokenizer):
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="stage 07 dispatcher")

    @app.get("/health")
    def health():
        return {"prefill": dispatcher.prefill_urls, "decode": dispatcher.decode_urls,
                "replicas": dispatcher.replicas, "router": dispatcher.stats()}

    @app.post("/generate")
    def generate(body: dict):
        prompt_ids = body.get("prompt_ids") or tokenizer(body.get("prompt", "")).input_ids
        try:
            return dispatcher.generate(prompt_ids, body.get("sampling", {}))
        except httpx.HTTPStatusError as e:  # the worker refused it (400, 429): say what it said
            raise HTTPException(e.response.status_code, e.response.text) from e
        except NoAliveWorkerError as e:
            raise HTTPException(503, str(e)) from e
        except (httpx.HTTPError, RuntimeError, WorkerDied) as e:
            raise HTTPException(502, str(e)) from e

    return app
