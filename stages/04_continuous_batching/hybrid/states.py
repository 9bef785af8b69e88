"""The state cache of linear-attention layers.

A full-attention layer keeps K/V for every position: any prefix of a sequence can resume from
the blocks that hold it. A linear-attention layer (gated DeltaNet) keeps one fixed-size state per
sequence, overwritten by every token: after 300 tokens it holds the state at 300, not at 256.
So a prefix hit needs a *copy* of the state taken when the sequence passed that boundary. Here:

* `current`: each running sequence's state in every linear layer, and the length it stands at;
* `snapshots`: copies taken at every `interval` tokens (a multiple of the block size), named
  by the same chained hash the block manager names the block ending there with; LRU-bounded;
* `usable_prefix`: the block manager's `prefix_limit`, so a hit stops at the deepest boundary
  with a snapshot, and the request recomputes only what lies past it.

The layer asks `load(layer, b)` for sequence b's state before this step's rows, runs its rows in
the runs `cuts(b)` gives (ending at each boundary, then at the chunk's end), and hands each
run's final state to `save`.

Speculative decoding: a verification chunk (the last token and k drafts) keeps the state after
every row, so whatever prefix of the drafts is accepted, the next step resumes from the state at
its end. We keep k+1 states rather than recompute from the last accepted token: k is small (a
state per draft is k small copies), and a recompute would cost a forward of the accepted rows.
A speculative *tree* is refused: its rows are not one sequence.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from course.s03_paged.block_manager import hash_block

State = tuple[torch.Tensor, torch.Tensor]  # (conv state [K-1, C], recurrent state [H, dk, dv])


def linear_layers(config) -> list[int]:
    """The layers whose mixer is linear attention (families/qwen3_next.py's mixer_types); [] for others."""
    return [i for i, kind in enumerate(getattr(config, "mixer_types", ()) or ()) if kind == "linear_attention"]


def state_bytes(config) -> int:
    """One sequence's states in every linear layer, float32: the conv's last K-1 inputs of its q, k,
    v channels, and the delta rule's [value heads, key dim, value dim] memory."""
    conv = (config.linear_conv_kernel_dim - 1) * (2 * config.linear_num_key_heads * config.linear_key_head_dim
                                                  + config.linear_num_value_heads * config.linear_value_head_dim)
    memory = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    return 4 * (conv + memory) * len(linear_layers(config))


def prefix_hash(token_ids: list[int], length: int, block_size: int) -> bytes | None:
    """The chained hash the block manager names the block ending at `length` with."""
    h = None
    for i in range(length // block_size):
        h = hash_block(h, token_ids[i * block_size:(i + 1) * block_size])
    return h


def chained_hashes(token_ids: list[int], block_size: int, upto: int, done: int = 0, h: bytes | None = None):
    """(length, prefix_hash(token_ids, length)) for each block end past `done` up to `upto`, chained on
    from `h`, the hash at `done`: each block hashed once."""
    for i in range(done // block_size, upto // block_size):
        h = hash_block(h, token_ids[i * block_size:(i + 1) * block_size])
        yield (i + 1) * block_size, h


class RecurrentStates:
    def __init__(self, layers: list[int], block_size: int, interval: int | None = None, max_snapshots: int = 512):
        self.layers, self.block_size = list(layers), block_size
        self.interval = interval or block_size
        if self.interval % block_size:
            raise ValueError(f"state snapshots every {self.interval} tokens: must be a multiple of the block "
                             f"size ({block_size}), where prefix hits end")
        self.max_snapshots = max_snapshots
        self.current: dict[int, tuple[int, dict[int, State]]] = {}  # request -> (length, layer -> state)
        self.snapshots: OrderedDict[bytes, dict[int, State]] = OrderedDict()
        self.batch: list[tuple[int, list[int], int, int]] = []   # this step: (request, ids, start, rows)
        self.drafted: set[int] = set()                            # this step's verification chunks
        self.after_row: dict[int, dict[int, dict[int, State]]] = {}  # request -> length -> layer -> state
        self.chains: dict[int, tuple[int, bytes | None]] = {}  # request -> (tokens hashed, their prefix hash)
        self.keys: list[dict[int, bytes | None]] = []  # this step, per sequence: boundary length -> its name
        self.restored_tokens = 0  # prompt tokens resumed from a snapshot (statistics)

    # ---- the engine's side ----------------------------------------------------------------
    def begin_step(self, batch: list[tuple[int, list[int], int, int]], drafted: set[int] = frozenset()) -> None:
        """This step's sequences in batch order: (request id, token ids, tokens computed, new rows);
        `drafted`: the requests whose rows verify drafts. A sequence that does not stand where its
        state does (drafts rejected, new, preempted, resumed from a prefix hit) starts from its
        state after the accepted rows, its snapshot there, or an empty state at 0."""
        self.batch, self.drafted = batch, set(drafted)
        for rid, ids, start, _ in batch:
            kept = self.after_row.pop(rid, {}).get(start)
            if rid in self.current and self.current[rid][0] == start:
                continue
            if kept is not None and len(kept) == len(self.layers):
                self.current[rid] = (start, kept)
                continue
            if start == 0:
                self.current[rid] = (0, {})
                continue
            key = self._hash_to(rid, ids, start) if start % self.interval == 0 else None
            snap = self.snapshots.get(key) if key is not None else None
            if snap is None or len(snap) < len(self.layers):
                raise RuntimeError(f"request {rid} resumes at {start} tokens with no saved state there (an engine bug: "
                                   "prefix hits are limited by usable_prefix)")
            self.snapshots.move_to_end(key)
            self.current[rid] = (start, dict(snap))
            self.restored_tokens += start
        # the names of the boundaries this step's rows reach, once per sequence (not once per layer)
        self.keys = [{length: self._hash_to(rid, ids, length)
                      for length in range((start // self.interval + 1) * self.interval, min(start + rows, len(ids)) + 1,
                                          self.interval)}
                     for rid, ids, start, rows in batch]

    def _hash_to(self, rid: int, ids: list[int], length: int) -> bytes | None:
        """prefix_hash(ids, length), chained on from the last length this request asked for, so a
        running sequence's blocks are hashed once each, not again at every boundary."""
        done, h = self.chains.get(rid, (0, None))
        if done > length:
            done, h = 0, None
        for _, h in chained_hashes(ids, self.block_size, length, done, h):
            pass  # the hash at `length` is the last one
        self.chains[rid] = (length, h)
        return h

    def end_step(self) -> None:
        for rid, _, start, rows in self.batch:
            self.current[rid] = (start + rows, self.current[rid][1])
        while len(self.snapshots) > self.max_snapshots:
            self.snapshots.popitem(last=False)
        self.batch = []

    def retain(self, request_ids: set[int]) -> None:
        """Forget the states of sequences no longer running (finished, aborted, preempted)."""
        for rid in [r for r in self.current if r not in request_ids]:
            del self.current[rid]
            self.after_row.pop(rid, None)
            self.chains.pop(rid, None)

    def usable_prefix(self, token_ids: list[int], hit_tokens: int) -> int:
        """The deepest boundary at or below `hit_tokens` where every linear layer's state was saved
        (the prefix hashed once, each boundary named on the way)."""
        if not self.snapshots:
            return 0
        deepest = hit_tokens - hit_tokens % self.interval
        names = {length: h for length, h in chained_hashes(token_ids, self.block_size, deepest)
                 if length % self.interval == 0}
        for length in sorted(names, reverse=True):
            snap = self.snapshots.get(names[length])
            if snap is not None and len(snap) == len(self.layers):
                return length
        return 0

    # ---- the layer's side -----------------------------------------------------------------
    def load(self, layer: int, b: int) -> State | tuple[None, None]:
        rid = self.batch[b][0]
        return self.current[rid][1].get(layer, (None, None))

    def cuts(self, b: int) -> list[int]:
        """Row counts into sequence b's new rows after which its state is wanted: each snapshot
        boundary the rows pass, then their end."""
        rid, _, start, rows = self.batch[b]
        if rid in self.drafted:  # a verification: the state after every row (any may be the last accepted)
            return list(range(1, rows + 1))
        first = (start // self.interval + 1) * self.interval
        return [p - start for p in range(first, start + rows, self.interval)] + [rows]

    def save(self, layer: int, b: int, rows: int, state: State) -> None:
        rid, ids, start, total = self.batch[b]
        length = start + rows
        if rows == total:
            self.current[rid][1][layer] = state
        if rid in self.drafted:
            self.after_row.setdefault(rid, {}).setdefault(length, {})[layer] = state
        key = self.keys[b].get(length)
        if key is not None:  # a boundary: keep a copy, named by its prefix
            self.snapshots.setdefault(key, {})[layer] = (state[0].clone(), state[1].clone())
            self.snapshots.move_to_end(key)
