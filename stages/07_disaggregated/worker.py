"""A prefill, decode or unified worker: one OS process, one engine with its own block pool, a
small internal HTTP API (FastAPI + uvicorn). Internal: it speaks token ids, not text or OpenAI.
A *unified* worker (a replica, `serve --replicas N`) runs whole requests itself: no connector,
/generate without kv_transfer_params.

  GET  /health    {"role", "rank"}: 200 once the model is loaded and the KV group is joined
  GET  /stats     the pool and the transfers (free blocks, leases held, loads, releases)
  GET  /state     a snapshot of this worker's engine: batch, block pool, queues   } plugged in by the
  GET  /events    the same snapshots, a few a second, while someone reads        } CLI: stage 04's watch/
  POST /prefill   {"prompt_ids", "sampling", "lease_s"?} -> {"first_token", "kv_transfer_params"}
                  runs the prompt to its first token and holds its blocks for a consumer
  POST /cancel    {"transfer_id"} -> {"cancelled": bool}: frees the blocks at once
  POST /generate  {"prompt_ids", "sampling", "kv_transfer_params"?} -> NDJSON lines, one per
                  token {"token_id", "text", "finish_reason", "logprob"}; the last also says where the
                  prompt's K/V came from ("kv": {"source": "remote" | "recomputed" | "none" | "local"});
                  without kv_transfer_params the worker runs the whole request (prefill too)

Every wait has a deadline: a prefill that does not finish in `request_timeout_s` is cancelled
(504), a stream that produces no token for that long ends with an error line and is aborted.

    python -m course.s07_disaggregated worker --role prefill --model DIR --port 8100 \
        --connector p2p --rank 0 --world-size 2 --dist-port 29500

(`python -m course.s07_disaggregated.worker ...` runs the same worker without the watch.)

The launcher binds each worker's sockets before starting it and hands them over (--fd,
--dist-fd): a port chosen by the parent and bound by the child seconds later, after loading the
model, could be taken in between by another process (gloo's own connections, for one).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import fields
from typing import Callable, Iterable

import torch
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from course.s01_decode_loop.sampling import SamplingParams
from course.s04_continuous_batching.engine import EngineConfig, QueueFullError

from .engine import DisaggConfig, DisaggEngine
from .engine_loop import EngineLoop

SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)} - {"logits_processors"}


def sampling_params(body: dict) -> SamplingParams:
    unknown = set(body.get("sampling", {})) - SAMPLING_FIELDS
    if unknown:
        raise HTTPException(400, f"unknown sampling fields: {sorted(unknown)}")
    try:
        return SamplingParams(**body.get("sampling", {}))
    except (TypeError, ValueError) as e:
        raise HTTPException(400, str(e)) from e


def build_app(loop: EngineLoop, role: str, rank: int = 0, request_timeout_s: float = 60.0) -> FastAPI:
    app = FastAPI(title=f"stage 07 {role} worker")

    async def on_engine(fn):
        return await asyncio.wrap_future(loop.submit(fn))

    @app.get("/health")
    async def health():
        return {"role": role, "rank": rank}

    @app.get("/stats")
    async def stats():
        return await on_engine(lambda e: e.kv_stats())

    @app.post("/prefill")
    async def prefill(body: dict):
        if role == "unified":
            raise HTTPException(400, "a unified worker has no KV connector: send the whole request to /generate")
        params, aio = sampling_params(body), asyncio.get_running_loop()
        done: asyncio.Future = aio.create_future()

        def add(engine: DisaggEngine):
            rid = engine.add_prefill_request(body["prompt_ids"], params, body.get("transfer_id"), body.get("lease_s"))
            loop.listeners[rid] = lambda out: aio.call_soon_threadsafe(
                lambda: done.done() or done.set_result((out, engine.exports.pop(rid, None))))
            return rid, engine.transfer_of[rid]

        try:
            rid, transfer_id = await on_engine(add)
        except QueueFullError as e:
            raise HTTPException(429, str(e)) from e
        except ValueError as e:  # too long for this pool, empty prompt, ...
            raise HTTPException(400, str(e)) from e
        try:
            out, transfer = await asyncio.wait_for(done, request_timeout_s)
        except asyncio.TimeoutError:
            await on_engine(lambda e: e.cancel(transfer_id))
            raise HTTPException(504, "the prefill did not finish in time; cancelled")
        finally:
            await on_engine(lambda e: loop.listeners.pop(rid, None))
        if out.error is not None or transfer is None:
            raise HTTPException(500, f"the prefill failed: {out.error}")
        return {"transfer_id": transfer_id, "first_token": transfer["first_token"], "kv_transfer_params": transfer}

    @app.post("/cancel")
    async def cancel(body: dict):
        return {"cancelled": await on_engine(lambda e: e.cancel(body["transfer_id"]))}

    @app.post("/generate")
    async def generate(body: dict):
        params, aio = sampling_params(body), asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()

        def add(engine: DisaggEngine):
            if body.get("kv_transfer_params") is None:  # a whole request, prefill included (a replica)
                rid = engine.add_request(body["prompt_ids"], params)
                engine.kv_origin[rid] = {"source": "local"}
                first = None  # its first token comes from a step, like every other one
            else:
                rid = engine.add_transferred_request(body["prompt_ids"], params, body["kv_transfer_params"])
                first = engine.first_events.pop(rid)  # the handed-over token, streamed at once
            loop.listeners[rid] = lambda out: aio.call_soon_threadsafe(tokens.put_nowait, out)
            return rid, first

        try:
            rid, first = await on_engine(add)
        except QueueFullError as e:
            raise HTTPException(429, str(e)) from e
        except ValueError as e:
            raise HTTPException(400, str(e)) from e

        async def stream():
            event = first
            try:
                while True:
                    if event is None:  # wait for the engine's next token for this request
                        try:
                            out = await asyncio.wait_for(tokens.get(), request_timeout_s)
                        except asyncio.TimeoutError:
                            yield json.dumps({"error": "no token in time; aborted", "finish_reason": "abort"}) + "\n"
                            return
                        if out.error is not None:
                            yield json.dumps({"error": str(out.error), "finish_reason": "error"}) + "\n"
                            return
                        event = out.event
                    line = {"token_id": event.token_id, "text": event.text, "finish_reason": event.finish_reason,
                            "logprob": event.logprob}  # None for the handed-over first token, or when not asked for
                    if event.finish_reason:
                        line["kv"] = await on_engine(lambda e: e.kv_origin.pop(rid, None))
                        yield json.dumps(line) + "\n"
                        return
                    yield json.dumps(line) + "\n"
                    event = None
            finally:  # also when the client goes away: the request stops and its blocks are freed
                def drop(engine: DisaggEngine):
                    loop.listeners.pop(rid, None)
                    engine.abort(rid)
                    engine.forget(rid)
                    engine.first_events.pop(rid, None)
                    engine.kv_origin.pop(rid, None)
                loop.submit(drop)

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course.s07_disaggregated worker",
                                description="A stage 07 prefill, decode or unified worker (internal HTTP API).")
    p.add_argument("--role", choices=["prefill", "decode", "unified"], required=True,
                   help="unified: a replica that runs whole requests, no KV transfer")
    p.add_argument("--model", help="model folder or .gguf (default: the course's default model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, help="the HTTP port (or --fd)")
    p.add_argument("--fd", type=int, help="serve HTTP on this inherited, already bound socket")
    p.add_argument("--connector", choices=["p2p", "shared_storage"], default="p2p")
    p.add_argument("--kv-dir", help="shared_storage: the folder both sides see")
    p.add_argument("--rank", type=int, default=0, help="p2p: this worker's rank (prefill workers first)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--dist-host", default="127.0.0.1", help="p2p: host of rank 0 (rendezvous and side channel)")
    p.add_argument("--dist-port", type=int, default=29500, help="p2p: rank 0's rendezvous port")
    p.add_argument("--dist-fd", type=int, help="p2p, rank 0: host the rendezvous on this inherited, bound socket")
    p.add_argument("--kv-blocks", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-dtype", default="auto", help="what the KV pool stores: auto, bfloat16, int8, fp8 "
                   "(every worker of a topology the same: a transfer between two layouts is refused)")
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--kv-load-timeout-s", type=float, default=10.0)
    p.add_argument("--request-timeout-s", type=float, default=60.0)
    p.add_argument("--cpus", help="pin this process to these cores, e.g. 0 or 0,1 (benchmarks); torch then "
                                  "uses one thread per core")
    return p


def pin_to_cpus(cpus: str) -> None:
    """Give this worker its own cores, so two workers on one machine do not take turns on the same
    ones (as two GPUs would not). Linux only: os.sched_setaffinity."""
    cores = {int(c) for c in cpus.split(",")}
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def make_connector(args):
    if args.connector == "shared_storage":
        from .shared_storage import SharedStorageConnector
        return SharedStorageConnector(args.kv_dir)
    from .p2p import P2PConnector
    return P2PConnector(args.rank, args.world_size, args.dist_host, args.dist_port, listen_fd=args.dist_fd)


def exit_with_parent(poll_s: float = 1.0) -> None:
    """If the process that started us dies (even by SIGKILL, which gives it no chance to stop
    us), stop too, the clean way: an orphaned worker would hold its port and memory forever."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's shutdown, as for a normal stop

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: list[str] | None = None, plug_ins: Iterable[Callable[[FastAPI, EngineLoop], None]] = ()) -> int:
    """One worker process. `plug_ins`: each called with the app and the engine loop once both are
    built, before the loop starts, to add routes and after-turn hooks (the CLI plugs in the watch)."""
    import uvicorn

    from course.s01_decode_loop.weights import load_model

    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.port is None) == (args.fd is None):
        parser.error("give exactly one of --port and --fd")
    # uvicorn re-raises the SIGTERM it caught once it has shut down; with the default handler that
    # would kill us before the engine loop and the KV group are closed below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    exit_with_parent()
    if args.cpus:
        pin_to_cpus(args.cpus)
    logging.basicConfig(level=logging.INFO, format=f"[{args.role} {args.rank}] %(levelname)s %(message)s")
    loaded = load_model(args.model, device="cuda" if torch.cuda.is_available() else "cpu")
    # p2p: waits here until every worker has joined; a unified worker transfers nothing
    connector = make_connector(args) if args.role != "unified" else None
    engine = DisaggEngine(loaded.model, loaded.tokenizer,
                          EngineConfig(num_blocks=args.kv_blocks, block_size=args.block_size,
                                       max_num_batched_tokens=args.max_num_batched_tokens, record_steps=False,
                                       kv_cache_dtype=args.kv_cache_dtype),
                          loaded.eos_token_ids, connector=connector,
                          disagg=DisaggConfig(lease_s=args.lease_s, kv_load_timeout_s=args.kv_load_timeout_s))
    loop = EngineLoop(engine)
    try:
        app = build_app(loop, args.role, args.rank, args.request_timeout_s)
        for plug_in in plug_ins:
            plug_in(app, loop)
        loop.start()
        if args.fd is not None:  # a socket the launcher bound for us and kept open since
            uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[socket.socket(fileno=args.fd)])
        else:
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:  # uvicorn returns on SIGTERM / Ctrl-C
        loop.stop()
        if connector is not None:
            connector.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
