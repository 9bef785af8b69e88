"""The KV connector: the seam between an engine and wherever its K/V travels to or from.

It has the shape of vLLM's `KVConnectorBase_V1`, reduced to what a two-worker setup needs:

  producer side (the prefill worker)
    register_kv_cache(cache)     the pool blocks are read from (and written to, on a consumer)
    save_kv(tid, prompt, blocks) make one request's computed blocks available to a consumer;
                                 returns the connector's part of the transfer parameters
    poll_producer(lookup)        serve what consumers asked for since the last call; return the
                                 transfer ids they are done with (the engine may free those blocks)
  consumer side (the decode worker)
    start_load(params, prompt, first_block, deadline)
                                 fetch blocks first_block.. of a request; a Future of per-layer
                                 (k, v) tensors [n_blocks, block_size, kv_heads, head_dim]
                                 (with their scales, for a quantized pool)
    confirm(params)              tell the producer it may free its blocks (loaded, or not needed)

In vLLM's words: register_kv_cache ~ register_kv_caches; save_kv ~ request_finished (which
asks to delay the free) plus save_kv_layer; start_load ~ get_num_new_matched_tokens plus
start_load_kv; poll_producer ~ get_finished (its finished_sending). vLLM splits each into a
scheduler half and a worker half because its model runs in other processes; ours runs in-line.

Every call here runs on the engine's own thread; anything slow (network waits) happens in the
connector's threads and comes back through a Future, so one slow transfer never stalls the
decodes of everyone else. A connector never touches the BlockManager: which blocks to send and
where to write them is the engine's business (engine.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from course.s03_paged.paged_attention import PagedKVCache

# per layer: (k, v), each [n, block_size, kv_heads, head_dim]; a quantized pool's (stage 03's
# quantized_kv.py) also its scales: (k codes, v codes, k scales, v scales), scales [n, block_size, kv_heads]
LayerBlocks = list[tuple[torch.Tensor, ...]]


class KVTransferError(RuntimeError):
    """A transfer failed or ran past its deadline; the consumer recomputes instead."""


@dataclass(frozen=True)
class KVLayout:
    """What the two pools must agree on before a block can go from one to the other."""
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str                # what the pool stores: float32, bfloat16, int8, float8_e4m3fn
    scale_dtype: str | None = None  # a quantized pool's scales: its blocks travel with them

    @classmethod
    def of(cls, cache: PagedKVCache) -> "KVLayout":
        layers, _, block_size, kv_heads, head_dim = cache.k.shape
        name = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
        return cls(layers, block_size, kv_heads, head_dim, name(cache.k), name(cache.k_scale) if cache.quantized else None)

    def blocks_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.block_size, self.num_kv_heads, self.head_dim)

    def parts(self, n: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor one layer's n blocks travel as: K and V, then their scales."""
        values = [(self.blocks_shape(n), getattr(torch, self.dtype))] * 2
        return values + ([(self.blocks_shape(n)[:-1], getattr(torch, self.scale_dtype))] * 2 if self.scale_dtype else [])

    def to_json(self) -> dict:
        return asdict(self)


def read_blocks(cache: PagedKVCache, block_ids: list[int]) -> LayerBlocks:
    """Copies of `block_ids` from every layer of the pool (a snapshot: the pool may change later)."""
    index = torch.tensor(block_ids, dtype=torch.long, device=cache.k.device)
    return [tuple(t[layer, index] for t in cache.tensors()) for layer in range(cache.k.shape[0])]


def done_future(result=None, error: Exception | None = None) -> Future:
    """A Future that is already settled (for connectors whose loads are instant)."""
    future: Future = Future()
    future.set_exception(error) if error else future.set_result(result)
    return future


class KVConnector(ABC):
    name = "base"

    def register_kv_cache(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.layout = KVLayout.of(cache)

    # ---- producer ---------------------------------------------------------------------------
    @abstractmethod
    def save_kv(self, transfer_id: str, prompt_ids: list[int], block_ids: list[int]) -> dict:
        """Make the request's K/V (the blocks holding `prompt_ids`, in order) available; return
        what a consumer needs to find it (JSON-able)."""

    def poll_producer(self, lookup: Callable[[str], list[int] | None]) -> list[str]:
        """Serve requests from consumers; `lookup(tid)` gives the blocks still held for a transfer
        (None once freed). Returns the transfer ids whose consumers confirmed."""
        return []

    # ---- consumer ---------------------------------------------------------------------------
    @abstractmethod
    def start_load(self, params: dict, prompt_ids: list[int], first_block: int, deadline: float) -> Future:
        """Begin fetching blocks first_block.. of the request `params` describes. The Future
        resolves to LayerBlocks, or to a KVTransferError; `deadline` is a time.time() value."""

    @abstractmethod
    def confirm(self, params: dict) -> None:
        """The consumer is done with this transfer (loaded it, gave up, or never needed it)."""

    def check_layout(self, params: dict) -> None:
        if params.get("layout") != self.layout.to_json():
            raise KVTransferError(f"the producer's KV layout {params.get('layout')} differs from ours "
                                  f"{self.layout.to_json()}: the two workers must run the same model and block size")

    def close(self) -> None:
        """Release what the connector holds (files, sockets, process groups)."""
