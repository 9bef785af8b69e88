"""ModelRunner: one engine step's forward, taken out of stage 04's `LLMEngine._run`.

Stage 04 built fresh tensors for every step. The runner owns *persistent buffers* sized for the
largest step (step_inputs.py) and copies each step into them: no allocation per step, and the
same addresses every step, which is what CUDA graphs need. The attention backend builds the
step's metadata from those views. A step that fits a captured bucket replays a graph instead.

    run(token_ids, seqs, sample_rows) -> RunOutput(logits of the sampling rows, hidden states)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from course.s01_decode_loop.model import CausalLM
from course.s03_paged.layer_groups import group_metadata

from .backend_base import KernelBackend
from .step_inputs import Feed, StepBuffers, step_inputs

if TYPE_CHECKING:
    from .graph_runner import GraphRunner


@dataclass
class RunOutput:
    logits: torch.Tensor  # [len(sample_rows), vocab] float32
    hidden: torch.Tensor  # [T, hidden]: the final hidden state of every row (speculation needs them)
    graphed: bool         # replayed from a captured graph (False: ran eagerly)


class ModelRunner:
    def __init__(self, model: CausalLM, backend: KernelBackend, *, max_num_tokens: int, max_num_seqs: int,
                 max_blocks_per_seq: int, dummy_block: int, graphs: GraphRunner | None = None, group_dummies=()):
        self.model, self.backend, self.graphs = model, backend, graphs
        self.block_size = backend.cache.block_size
        self.dummy_block = dummy_block  # table padding points here: a valid id no sequence owns
        self.buffers = StepBuffers(max_num_tokens, max_num_seqs, max_blocks_per_seq, dummy_block, self.block_size,
                                   model.device)
        # every other layer group's buffers (stage 03's layer_groups.py), padded with its own pool's dummy block
        self.group_buffers = [(StepBuffers(max_num_tokens, max_num_seqs, max_blocks_per_seq, d, self.block_size,
                                           model.device), d) for d in group_dummies]

    @torch.no_grad()
    def run(self, token_ids: list[int], seqs: list[tuple[int, int, list[int]]], sample_rows: list[int],
            feed: Feed | None = None, trees: dict | None = None, groups: list | None = None) -> RunOutput:
        """seqs: (num_cached, num_new, block_table) per sequence, as stage 04's engine flattens them.
        feed: rows whose ids are still on the device (`StepBuffers.fill`). trees: sequence ->
        (depths, mask) for a chunk that is a speculative tree, [root, nodes...]: row i at position
        num_cached + depths[i] (siblings share one), attending as mask [n, n] allows (eager only).
        groups: every other layer group's seqs (its tables), each built into its own metadata."""
        replayed = self.graphs.replay(token_ids, seqs, sample_rows, feed) if self.graphs and not trees else None
        if replayed is not None:
            hidden, logits = replayed
            return RunOutput(logits, hidden, graphed=True)
        ids, meta = self.prepare(token_ids, seqs, feed, trees)
        if groups:  # (trees move K/V within one pool: final/ drafts chains for such a model)
            meta = group_metadata(meta, [self.prepare(token_ids, seqs_g, group=g)[1]
                                         for g, seqs_g in enumerate(groups, 1)], self.backend.cache)
        hidden = self.model(ids, self.backend, meta)
        logits = self.model.compute_logits(hidden[sample_rows]) if sample_rows else hidden.new_empty(0)
        return RunOutput(logits, hidden, graphed=False)

    def prepare(self, token_ids, seqs, feed: Feed | None = None, trees: dict | None = None, group: int = 0):
        """Fill the persistent buffers (layer group `group`'s) for one eager step; returns (input ids, metadata)."""
        buffers, dummy = self.group_buffers[group - 1] if group else (self.buffers, self.dummy_block)
        inputs = step_inputs(seqs, self.block_size, dummy)
        for b, (depths, _) in (trees or {}).items():  # a tree's rows: positions by depth, slots in order
            first = inputs.cu_seqlens_q[b]
            inputs.positions[first:first + len(depths)] = [seqs[b][0] + d for d in depths]
        ids = buffers.fill(token_ids, inputs, feed)
        meta = self.backend.build_metadata(**buffers.views(len(token_ids), len(seqs), inputs.width),
                                           max_query_len=max(inputs.query_lens), max_seq_len=max(inputs.seq_lens),
                                           host_lens=(inputs.query_lens, inputs.seq_lens),
                                           trees={b: mask for b, (_, mask) in trees.items()} if trees else None)
        return ids, meta
