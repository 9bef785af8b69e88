"""The simplest connector: blocks go through a shared folder, one safetensors file per block.

A file is named by stage 03's chained block hash, so its name says which tokens it holds *and*
everything before them: the consumer computes the same names from the prompt alone, and two
requests with a common prefix write (and find) the same files. The partial last block is named
the same way, by the hash of its few tokens chained to the block before (a different length,
so never the name of a full block).

Good for tests and for learning the seam: no sockets, and a file can be opened and looked at.
A real deployment would use a faster medium (vLLM's SharedStorageConnector is the same idea and
is also meant as an example), and something would have to delete old files: here nothing does.

Confirmation is a marker file `done/<transfer id>` the producer looks for when polled.
"""
from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from course.s03_paged.block_manager import hash_block

from .kv_connector import KVConnector, KVTransferError, done_future, read_blocks


def block_names(prompt_ids: list[int], block_size: int) -> list[str]:
    """One file name per block of the prompt: the chained hash of its tokens, in hex."""
    names, prev = [], None
    for start in range(0, len(prompt_ids), block_size):
        prev = hash_block(prev, prompt_ids[start:start + block_size])
        names.append(prev.hex())
    return names


class SharedStorageConnector(KVConnector):
    name = "shared_storage"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        (self.root / "done").mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.safetensors"

    # ---- producer ---------------------------------------------------------------------------
    def save_kv(self, transfer_id: str, prompt_ids: list[int], block_ids: list[int]) -> dict:
        names = block_names(prompt_ids, self.layout.block_size)
        assert len(names) == len(block_ids), "one block per block_size tokens of the prompt"
        for name, parts in zip(names, _per_block(read_blocks(self.cache, block_ids))):
            path = self._path(name)
            if not path.exists():  # an earlier request with this prefix already wrote it
                tmp = path.with_suffix(f".{os.getpid()}.tmp")  # write, then rename: a reader never
                save_file(dict(zip(PARTS, parts)), tmp)        # sees half a file
                os.replace(tmp, path)
        return {"root": str(self.root)}

    def poll_producer(self, lookup: Callable[[str], list[int] | None]) -> list[str]:
        confirmed = []
        for marker in (self.root / "done").iterdir():
            if lookup(marker.name) is not None:  # a transfer of ours: its consumer is done
                confirmed.append(marker.name)
                marker.unlink(missing_ok=True)
        return confirmed

    # ---- consumer ---------------------------------------------------------------------------
    def start_load(self, params: dict, prompt_ids: list[int], first_block: int, deadline: float) -> Future:
        try:
            self.check_layout(params)
            names = block_names(prompt_ids, self.layout.block_size)[first_block:]
            blocks = [load_file(self._path(name), device=str(self.cache.k.device)) for name in names]
        except (OSError, KVTransferError) as e:  # a missing file: written by no one, or deleted
            return done_future(error=e if isinstance(e, KVTransferError) else KVTransferError(str(e)))
        parts = PARTS[:len(self.layout.parts(0))]
        return done_future([tuple(torch.stack([b[part][layer] for b in blocks]) for part in parts)
                            for layer in range(self.layout.num_layers)])

    def confirm(self, params: dict) -> None:
        (self.root / "done" / params["transfer_id"]).touch()


PARTS = ("k", "v", "k_scale", "v_scale")  # a block file's tensors (the scales: a quantized pool's)


def _per_block(layers):
    """Per-layer [n, ...] tensors regrouped per block: (k, v[, scales]), each [layers, ...]."""
    stacked = [torch.stack([parts[i] for parts in layers], dim=1) for i in range(len(layers[0]))]  # [n, layers, ...]
    return [tuple(t[b].contiguous() for t in stacked) for b in range(stacked[0].shape[0])]
