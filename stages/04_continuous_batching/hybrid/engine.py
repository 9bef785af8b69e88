"""An engine for hybrid models: any batched engine (stage 04's, stage 06's, final's) plus the
state cache of their linear-attention layers (states.py).

Each step tells the cache which sequences run, from where and how many rows; the layers load and
save their states through the backend's `recurrent` seam (stage 01's attention.py). The block
manager's prefix hits stop where a state snapshot exists. Preemption needs nothing more: a
preempted sequence's state is dropped, and it resumes from its prefix hit's snapshot, or from 0.
Speculative decoding keeps the state after every row of a verification (states.py); trees and
overlap (a step launched before the last one's tokens are known) are refused.
"""
from __future__ import annotations

from .states import RecurrentStates, linear_layers


class HybridStates:
    """Mix in before an engine class: `class Engine(HybridStates, LLMEngine)`."""

    def __init__(self, model, tokenizer, config=None, *args, state_interval: int | None = None,
                 max_state_snapshots: int = 512, **kw):
        super().__init__(model, tokenizer, config, *args, **kw)
        if getattr(self.config, "overlap", False):
            raise ValueError("a model with linear-attention layers runs without overlap: a step launched before "
                             "the last one's tokens are known would continue its recurrent state from a guess")
        self.states = RecurrentStates(linear_layers(model.config), self.config.block_size, state_interval,
                                      max_state_snapshots)
        self.attn.recurrent = self.states
        self.blocks.prefix_limit = self.states.usable_prefix

    @property
    def trees(self):  # final/'s speculative trees: never here
        return None

    @trees.setter
    def trees(self, drafting) -> None:
        if drafting is not None:
            raise ValueError("speculative trees on a model with linear-attention layers: a tree's rows are not one "
                             "sequence, so the recurrent state cannot follow them; draft chains")

    def _run(self, chunks, *args, **kw):
        drafts = getattr(self, "drafts", {})  # final/'s engine: this step's drafts per request
        self.states.begin_step([(req.request_id, req.all_ids, req.num_computed_tokens, n) for req, n in chunks],
                               {req.request_id for req, _ in chunks if drafts.get(req.request_id)})
        try:
            return super()._run(chunks, *args, **kw)
        finally:
            self.states.end_step()

    def step(self):
        outputs = super().step()
        self.states.retain({req.request_id for req in self.scheduler.running})
        return outputs

    def stats(self) -> dict:
        return {**super().stats(), "state_snapshots": len(self.states.snapshots),
                "state_restored_tokens": self.states.restored_tokens}
