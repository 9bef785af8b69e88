"""ModelRunner: one engine step's forward, taken out of stage 04's `LLMEngine._run`.

Stage 04 built fresh tensors for every step. The runner instead owns *persistent buffers*
(token ids, positions, slot mapping, sequence lengths, block tables) sized for the largest
step, and copies each step's host-side description into views of them: no allocation per
step, and the same addresses every step, which is what CUDA graphs need (graph_runner.py).
The attention backend, chosen by name, builds the step's metadata from those views.

    run(token_ids, seqs, sample_rows) -> RunOutput(logits of the sampling rows, hidden states)

Steps that fit a captured graph bucket are replayed through the GraphRunner: decode-only
steps by batch size, mixed steps (prefill chunks, verifications) by token count. Steps past
the largest buckets run eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from course.s01_decode_loop.model import CausalLM

from .backends import KernelBackend

if TYPE_CHECKING:
    from .graph_runner import GraphRunner


@dataclass
class RunOutput:
    logits: torch.Tensor  # [len(sample_rows), vocab] float32
    hidden: torch.Tensor  # [T, hidden]: the final hidden state of every row (speculation needs them)
    graphed: bool         # replayed from a captured graph (False: ran eagerly)


def upload(buffer: torch.Tensor, values: list[int]) -> torch.Tensor:
    """Copy host ints into the front of a persistent buffer; returns that view. On CUDA the
    staging tensor is pinned, so the copy is asynchronous."""
    n = len(values)
    staging = torch.tensor(values, dtype=buffer.dtype, pin_memory=buffer.is_cuda)
    view = buffer[:n]
    view.copy_(staging, non_blocking=buffer.is_cuda)
    return view


Feed = tuple[torch.Tensor, torch.Tensor]  # (rows, token ids) on the device: ids the host has not read


def upload_ids(buffer: torch.Tensor, token_ids: list[int], feed: Feed | None) -> torch.Tensor:
    """The step's token ids into the front of the input buffer; the rows in `feed` then take
    tokens the previous step sampled on the device (overlap/), a device-to-device copy."""
    view = upload(buffer, token_ids)
    if feed is not None:
        buffer.index_copy_(0, *feed)
    return view


class ModelRunner:
    def __init__(self, model: CausalLM, backend: KernelBackend, *, max_num_tokens: int, max_num_seqs: int,
                 max_blocks_per_seq: int, dummy_block: int, graphs: GraphRunner | None = None):
        self.model, self.backend, self.graphs = model, backend, graphs
        self.block_size = backend.cache.block_size
        self.dummy_block = dummy_block  # table padding points here: a valid id no sequence owns
        long = dict(dtype=torch.long, device=model.device)
        self.input_ids = torch.zeros(max_num_tokens, **long)
        self.positions = torch.zeros(max_num_tokens, **long)
        self.slot_mapping = torch.zeros(max_num_tokens, **long)
        self.seq_lens = torch.zeros(max_num_seqs, **long)
        self.cu_seqlens_q = torch.zeros(max_num_seqs + 1, **long)
        # flat, so that any [B, W] view of its front is contiguous (kernels index rows by W)
        self.block_tables = torch.zeros(max_num_seqs * max_blocks_per_seq, **long)

    @torch.no_grad()
    def run(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
            feed: Feed | None = None) -> RunOutput:
        """seqs: (num_cached, num_new, block_table) per sequence, as stage 04's engine flattens them.
        feed: rows whose ids are still on the device (see `upload_ids`)."""
        max_seq_len = max(c + n for c, n, _ in seqs)
        if self.graphs and all(n == 1 for _, n, _ in seqs) and self.graphs.fits(len(seqs), max_seq_len):
            hidden, logits = self.graphs.run(token_ids, seqs, feed)  # every decode row samples
            return RunOutput(logits, hidden, graphed=True)
        if self.graphs and self.graphs.fits_mixed(len(token_ids), len(seqs), max_seq_len, len(sample_rows)):
            hidden, logits = self.graphs.run_mixed(token_ids, seqs, sample_rows, feed)
            return RunOutput(logits, hidden, graphed=True)
        ids, meta = self.prepare(token_ids, seqs, feed)
        hidden = self.model(ids, self.backend, meta)
        logits = self.model.compute_logits(hidden[sample_rows]) if sample_rows else hidden.new_empty(0)
        return RunOutput(logits, hidden, graphed=False)

    def prepare(self, token_ids, seqs, feed: Feed | None = None):
        """Fill the persistent buffers for one eager step; returns (input ids, metadata)."""
        bs = self.block_size
        positions, slots, cu, tables = [], [], [0], []
        width = max(-(-(c + n) // bs) for c, n, _ in seqs)
        for cached, new, table in seqs:
            for p in range(cached, cached + new):
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            cu.append(cu[-1] + new)
            used = table[:width]
            tables += used + [self.dummy_block] * (width - len(used))
        meta = self.backend.build_metadata(
            positions=upload(self.positions, positions), cu_seqlens_q=upload(self.cu_seqlens_q, cu),
            seq_lens=upload(self.seq_lens, [c + n for c, n, _ in seqs]),
            slot_mapping=upload(self.slot_mapping, slots),
            block_tables=upload(self.block_tables, tables).view(len(seqs), width),
            max_query_len=max(n for _, n, _ in seqs), max_seq_len=max(c + n for c, n, _ in seqs),
            host_lens=([n for _, n, _ in seqs], [c + n for c, n, _ in seqs]))
        return upload_ids(self.input_ids, token_ids, feed), meta
