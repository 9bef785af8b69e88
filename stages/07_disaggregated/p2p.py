"""KV over the network: torch.distributed point-to-point, one tensor per layer and per K/V.

Every worker joins one gloo process group through a TCP rendezvous at rank 0,
so workers may sit on different hosts. Gloo moves host memory,
so a GPU pool is staged through the CPU. (NCCL would send GPU memory directly, but it ignores
tags and matches a pair's sends and receives in issue order, so concurrent pulls would have to
be serialized; not done here.) Prefill
workers are ranks 0..P-1, decode workers P..P+D-1. The rendezvous is a torch.distributed
TCPStore (a small key-value server hosted by rank 0, on one port); the same store is the *side
channel* for the few words the two sides must exchange: "send me these blocks", "I am done".

One pull, as the consumer (decode) sees it:

    consumer                                    producer (holds the blocks under a lease)
    irecv(header, tag)           posted first, so the producer's send always finds it
    inbox/<producer>/<n> = {pull: tid, first_block, tag, my rank}   (side channel)
                                                poll_producer() reads its inbox, looks the
                                                transfer up: header = number of blocks, or -1
                                                when the lease is gone; then isend per layer
                                                k[layer, blocks], v[layer, blocks] (tags tag+1..)
    wait(header): -1 -> fail now (recompute); else irecv 2 x layers tensors, wait each
    ...writes them into its own pool (engine.py), then
    inbox/<producer>/<n+1> = {done: tid}        poll_producer() reports tid confirmed: freed

Every wait has the request's deadline: gloo's `Work.wait(timeout)` raises when it passes (and
cannot be waited on again afterwards, so each wait is one call with all the time that is left).
Tags are unique in the whole group (a counter in the store), so a late send can only ever land
in the buffer of the pull that asked for it, never in someone else's.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from .kv_connector import KVConnector, KVTransferError, LayerBlocks, done_future, read_blocks


class P2PConnector(KVConnector):
    name = "p2p"

    def __init__(self, rank: int, world_size: int, host: str, port: int, listen_fd: int | None = None,
                 connect_timeout_s: float = 60.0, send_timeout_s: float = 30.0):
        """`listen_fd`: rank 0 may be handed a socket already bound to `port` (the launcher binds
        it before starting us), so no other process can take the port while we load the model."""
        self.rank = rank
        self.send_timeout_s = send_timeout_s
        self.store = dist.TCPStore(host, port, world_size, is_master=(rank == 0),
                                   timeout=timedelta(seconds=connect_timeout_s), wait_for_workers=False,
                                   master_listen_fd=listen_fd if rank == 0 else None)
        # blocks until all world_size workers have joined (or raises after the timeout)
        dist.init_process_group("gloo", store=dist.PrefixStore("group", self.store), rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=connect_timeout_s))
        self._next_message = 1
        self._threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kv-p2p")  # the waits live here

    # ---- the side channel -----------------------------------------------------------------
    def _post(self, to_rank: int, message: dict) -> None:
        """Append a message to a worker's inbox: a counter names the next free key. (A sender
        that died between the two calls would leave a gap the reader waits at forever; a real
        system would skip a key that stays missing. Not handled here.)"""
        n = self.store.add(f"inbox/{to_rank}", 1)
        self.store.set(f"inbox/{to_rank}/{n}", json.dumps(message))

    def _read_inbox(self) -> list[dict]:
        messages = []
        while self.store.check([key := f"inbox/{self.rank}/{self._next_message}"]):
            messages.append(json.loads(self.store.get(key)))
            self.store.delete_key(key)
            self._next_message += 1
        return messages

    # ---- producer -------------------------------------------------------------------------
    def save_kv(self, transfer_id: str, prompt_ids: list[int], block_ids: list[int]) -> dict:
        return {"rank": self.rank}  # the blocks stay in the pool, held, until someone pulls them

    def poll_producer(self, lookup: Callable[[str], list[int] | None]) -> list[str]:
        confirmed = []
        for message in self._read_inbox():
            held = lookup(message["transfer_id"])
            if message["op"] == "pull":
                self._send(message, held)
            elif message["op"] == "done" and held is not None:
                confirmed.append(message["transfer_id"])
        return confirmed

    def _send(self, pull: dict, held: list[int] | None) -> None:
        blocks = held[pull["first_block"]:] if held is not None else []
        header = torch.tensor([len(blocks) if held is not None else -1], dtype=torch.long)
        tensors = [header] + [t for kv in (read_blocks(self.cache, blocks) if blocks else []) for t in kv]
        tensors = [t.to("cpu").contiguous() for t in tensors]  # gloo sends host memory (a GPU pool is staged)
        works = [dist.isend(t, dst=pull["rank"], tag=pull["tag"] + i) for i, t in enumerate(tensors)]
        # wait in a thread: the tensors must live until sent, and the engine must not stall
        self._threads.submit(_wait_all, works, time.time() + self.send_timeout_s, tensors)

    # ---- consumer -------------------------------------------------------------------------
    def start_load(self, params: dict, prompt_ids: list[int], first_block: int, deadline: float) -> Future:
        try:
            self.check_layout(params)
        except KVTransferError as e:
            return done_future(error=e)
        num_tags = 1 + len(self.layout.parts(0)) * self.layout.num_layers
        tag = self.store.add("kv/tags", num_tags) - num_tags  # tags tag .. tag+num_tags-1 are ours alone
        return self._threads.submit(self._receive, params, first_block, tag, deadline)

    def _receive(self, params: dict, first_block: int, tag: int, deadline: float) -> LayerBlocks:
        src, expected = params["rank"], params["num_blocks"] - first_block
        header = torch.zeros(1, dtype=torch.long)
        work = dist.irecv(header, src=src, tag=tag)
        self._post(src, {"op": "pull", "transfer_id": params["transfer_id"], "first_block": first_block,
                         "tag": tag, "rank": self.rank})
        _wait(work, deadline)
        if header.item() != expected:
            raise KVTransferError(f"the producer no longer holds transfer {params['transfer_id']} (lease expired?)"
                                  if header.item() < 0 else f"expected {expected} blocks, the producer has {header.item()}")
        parts = self.layout.parts(expected)  # K, V (and a quantized pool's scales) of each layer
        buffers = [torch.empty(shape, dtype=dtype) for _ in range(self.layout.num_layers) for shape, dtype in parts]
        works = [dist.irecv(b, src=src, tag=tag + 1 + i) for i, b in enumerate(buffers)]  # host memory, as sent
        _wait_all(works, deadline)
        return [tuple(buffers[layer * len(parts):(layer + 1) * len(parts)]) for layer in range(self.layout.num_layers)]

    def confirm(self, params: dict) -> None:
        self._post(params["rank"], {"op": "done", "transfer_id": params["transfer_id"]})

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        # a receive abandoned at its deadline may still be posted; do not let it block the exit
        closer = threading.Thread(target=dist.destroy_process_group, daemon=True)
        closer.start()
        closer.join(timeout=5)


def _wait(work, deadline: float) -> None:
    left = deadline - time.time()
    if left <= 0:
        raise KVTransferError("the transfer ran past its deadline")
    try:
        work.wait(timeout=timedelta(seconds=left))
    except RuntimeError as e:  # gloo: a timeout, or the peer's connection closed
        raise KVTransferError(f"transfer failed: {str(e).splitlines()[0][:200]}") from e


def _wait_all(works, deadline: float, keep_alive=None) -> None:
    for work in works:
        _wait(work, deadline)
