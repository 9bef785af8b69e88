"""One step's inputs, flattened once, and the persistent buffers they are copied into.

Stage 04's engine describes a step as `(num_cached, num_new, block_table)` per sequence; the
kernels want it flat (nano-vllm's prepare_prefill / prepare_decode). Block size 4:

    seqs = [(5, 3, [7, 2]), (9, 1, [4, 1, 6])]
    positions    5 6 7 | 9            slot_mapping  2*4+1 2*4+2 2*4+3 | 1*4+1
    cu_seqlens_q 0 3 4                seq_lens      8 10
    block_tables [7 2 D] [4 1 6]      (width 3, padded with the dummy block D)

A captured decode step pads its bucket with sequences `(0, 1, [])`: one token at position 0, its
table all dummy blocks. `StepBuffers` holds the device side, sized for the largest step and
refilled in place: the same addresses every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Feed = tuple[torch.Tensor, torch.Tensor]  # (rows, token ids) on the device: ids the host has not read


@dataclass
class StepInputs:
    positions: list[int]     # [T] each new token's position
    slot_mapping: list[int]  # [T] where its K/V goes: block * block_size + offset
    cu_seqlens_q: list[int]  # [B + 1] where each sequence's rows start
    query_lens: list[int]    # [B] new tokens per sequence
    seq_lens: list[int]      # [B] tokens each sequence holds after the step
    block_tables: list[int]  # [B * width] each table cut or padded to `width`, row after row
    width: int


def step_inputs(seqs: list[tuple[int, int, list[int]]], block_size: int, dummy_block: int,
                width: int | None = None) -> StepInputs:
    """seqs: (num_cached, num_new, block_table) per sequence. width: the tables' width (default:
    the blocks the longest sequence needs)."""
    width = width or max(-(-(c + n) // block_size) for c, n, _ in seqs)
    out = StepInputs([], [], [0], [], [], [], width)
    for cached, new, table in seqs:
        table = table[:width] + [dummy_block] * (width - len(table[:width]))
        out.positions += range(cached, cached + new)
        out.slot_mapping += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + new)]
        out.cu_seqlens_q.append(out.cu_seqlens_q[-1] + new)
        out.query_lens.append(new)
        out.seq_lens.append(cached + new)
        out.block_tables += table
    return out


def upload(buffer: torch.Tensor, values: list[int]) -> torch.Tensor:
    """Copy host ints into the front of a persistent buffer; returns that view. On CUDA the
    staging tensor is pinned, so the copy is asynchronous."""
    staging = torch.tensor(values, dtype=buffer.dtype, pin_memory=buffer.is_cuda)
    view = buffer[:len(values)]
    view.copy_(staging, non_blocking=buffer.is_cuda)
    return view


class StepBuffers:
    """A step's inputs on the device, at fixed addresses. Until the first step they describe an
    empty one (no sequence owns a row, every row writes into the dummy block), which any bucket
    may be captured on."""

    def __init__(self, max_tokens: int, max_seqs: int, max_width: int, dummy_block: int, block_size: int, device):
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(max_tokens, **long)
        self.positions = torch.zeros(max_tokens, **long)
        self.slot_mapping = torch.full((max_tokens,), dummy_block * block_size, **long)
        self.seq_lens = torch.ones(max_seqs, **long)
        self.cu_seqlens_q = torch.zeros(max_seqs + 1, **long)
        # flat, so that any [B, W] view of its front is contiguous (kernels index rows by W)
        self.block_tables = torch.full((max_seqs * max_width,), dummy_block, **long)

    def fill(self, token_ids: list[int], inputs: StepInputs, feed: Feed | None = None) -> torch.Tensor:
        """Copy a step in; returns the input ids' view. The rows in `feed` then take tokens the
        previous step sampled on the device (overlap/), a device-to-device copy."""
        ids = upload(self.input_ids, token_ids)
        if feed is not None:
            self.input_ids.index_copy_(0, *feed)
        for name in ("positions", "slot_mapping", "seq_lens", "cu_seqlens_q", "block_tables"):
            upload(getattr(self, name), getattr(inputs, name))
        return ids

    def views(self, num_tokens: int, num_seqs: int, width: int) -> dict[str, torch.Tensor]:
        """The front of each buffer, as a backend's `build_metadata` takes them."""
        return dict(positions=self.positions[:num_tokens], slot_mapping=self.slot_mapping[:num_tokens],
                    seq_lens=self.seq_lens[:num_seqs], cu_seqlens_q=self.cu_seqlens_q[:num_seqs + 1],
                    block_tables=self.block_tables[:num_seqs * width].view(num_seqs, width))
