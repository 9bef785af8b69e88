"""Helpers for the stage's tests: the two ends of a P2P transfer, each in its own process.
First the bare connector (blocks of a random pool), then a whole handoff between two engines.

They live in the package (not in tests/) because a spawned process must import its target by name.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import torch
import torch.distributed as dist

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer, tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s04_continuous_batching.engine import EngineConfig

from .engine import DisaggEngine
from .kv_connector import KVLayout, KVTransferError
from .p2p import P2PConnector

NUM_BLOCKS, BLOCK_SIZE = 12, 4
HELD = [5, 2, 9]  # the producer's blocks of one request, in order: deliberately not 0, 1, 2
PROMPT = list(range(40, 59))  # 19 tokens: 4 full blocks of 4 and a partial one
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)


def random_pool(seed: int) -> PagedKVCache:
    cache = PagedKVCache(TINY_CONFIGS["gqa_tied"], NUM_BLOCKS, BLOCK_SIZE)
    g = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def transfer_params(transfer_id: str, cache: PagedKVCache) -> dict:
    return {"transfer_id": transfer_id, "rank": 0, "num_blocks": len(HELD), "layout": KVLayout.of(cache).to_json()}


def p2p_producer(port: int, results, handoff, timeout_s: float = 60.0) -> None:
    """Rank 0: holds HELD of a random pool for transfer "t" until its consumer confirms."""
    connector = P2PConnector(0, 2, "127.0.0.1", port)
    connector.register_kv_cache(random_pool(seed=0))
    held = {"t": HELD}
    deadline = time.time() + timeout_s
    try:
        while held and time.time() < deadline:
            for tid in connector.poll_producer(held.get):
                del held[tid]
            time.sleep(0.01)
        results.put(("producer", "confirmed" if not held else "timed out"))
        engine_producer(connector, results, handoff)
        dist.barrier()  # both sides are done with the group (however long the other took): leave together
    finally:
        connector.close()


def p2p_consumer(port: int, results, handoff) -> None:
    """Rank 1: pulls blocks 1.. of "t"; then asks for a transfer the producer never held."""
    connector = P2PConnector(1, 2, "127.0.0.1", port)
    connector.register_kv_cache(PagedKVCache(TINY_CONFIGS["gqa_tied"], NUM_BLOCKS, BLOCK_SIZE))
    try:
        unknown = connector.start_load(transfer_params("gone", connector.cache), [], 0, time.time() + 30)
        results.put(("unknown", type(unknown.exception(timeout=60)).__name__))
        params = transfer_params("t", connector.cache)
        layers = connector.start_load(params, [], 1, time.time() + 30).result(timeout=60)
        results.put(("layers", [(k.clone(), v.clone()) for k, v in layers]))
        wrong = {**params, "layout": {**params["layout"], "block_size": 8}}
        try:
            connector.start_load(wrong, [], 0, time.time() + 30).result(timeout=60)
            results.put(("layout", "accepted"))
        except KVTransferError:
            results.put(("layout", "refused"))
        connector.confirm(params)
        engine_consumer(connector, results, handoff)
        dist.barrier()
    finally:
        connector.close()


ENGINE_CONFIG = EngineConfig(num_blocks=24, block_size=4, kv_cache_dtype="int8")  # codes and scales travel


def tiny_engine(connector) -> DisaggEngine:
    return DisaggEngine(tiny_model("mqa_odd_heads"), byte_tokenizer(), ENGINE_CONFIG, connector=connector)


def prompt_kv(engine: DisaggEngine, table: list[int], n: int):
    """A sequence's K/V (a quantized pool: codes, then scales) for its first n positions, read
    through its block table."""
    t = torch.tensor(table)
    return tuple(x[:, t].flatten(1, 2)[:, :n].clone() for x in engine.cache.tensors())


def engine_producer(connector, results, handoff, timeout_s: float = 60.0) -> None:
    """Prefill PROMPT, report its K/V as computed, hand over, serve the pull until confirmed."""
    engine = tiny_engine(connector)
    rid = engine.add_prefill_request(PROMPT, GREEDY)
    while engine.has_unfinished():
        engine.step()
    transfer = engine.exports.pop(rid)
    results.put(("computed", prompt_kv(engine, engine.held_blocks(transfer["transfer_id"]), len(PROMPT))))
    handoff.put(transfer)
    deadline = time.time() + timeout_s
    while engine.leases and time.time() < deadline:
        engine.service_kv()
        time.sleep(0.01)
    results.put(("engine producer", (dict(engine.released), engine.kv_stats()["ref_count_sum"])))


def engine_consumer(connector, results, handoff, timeout_s: float = 60.0) -> None:
    """Take the handoff into our own pool (at other block ids), report the K/V and the output."""
    engine = tiny_engine(connector)
    engine.blocks.allocate(-1, list(range(9)))  # occupy blocks 0-2: ours will differ from the producer's
    rid = engine.add_transferred_request(PROMPT, GREEDY, handoff.get(timeout=timeout_s))
    deadline = time.time() + timeout_s
    while rid in engine.loading and time.time() < deadline:
        engine.service_kv()
        time.sleep(0.01)
    results.put(("received", prompt_kv(engine, engine.blocks.tables[rid], len(PROMPT))))
    while engine.has_unfinished():
        engine.step()
    engine.blocks.free(-1)
    results.put(("engine consumer", (engine.requests[rid].seq.output_ids, engine.kv_origin[rid]["source"],
                                     engine.blocks.num_free_blocks)))


def worker_stats(worker) -> dict:
    return httpx.get(f"{worker.url}/stats", timeout=10).json()


def settled(worker, timeout_s: float = 30.0) -> dict:
    """The worker's stats once nothing is held, loading or running (confirmations travel
    asynchronously, so give them a moment; this bounds the wait, it does not time anything)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = worker_stats(worker)
        if not (s["held"] or s["loading"] or s["running"] or s["waiting"]) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Is this process still running (a zombie has exited: it only waits to be reaped)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop_front_and_workers(proc, worker_pids, sig=signal.SIGINT, timeout_s: float = 30.0) -> None:
    """Teardown of a `serve` process that started workers, on failure too: the front first
    (it stops its workers), killed if it lingers, then any worker still alive.
    `worker_pids`: a callable, read after the front has gone (its log names them)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in worker_pids():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
