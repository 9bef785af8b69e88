"""A smaller model with the target's tokenizer drafts k tokens, one cheap forward each.

Any Llama-family model sharing the target's vocabulary works. Offline we have no second
model, so the default draft is the target *truncated*: its first few decoder layers, then
its own final norm and lm_head (the weights are shared, nothing is copied). It is a weak
guesser (it never saw training as a 4-layer model) but a real one, and it shows the cost
structure: the draft forward is ~layers_draft/layers_target of a target step.

The draft keeps its own KV cache. After verification the target may have rejected some of
its tokens, so before drafting it rolls its cache back to the longest prefix it shares with
the sequence and catches up on the rest in one forward.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sequence import Sequence
from course.s02_kv_cache.generate import forward_step
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache

from .drafter import Draft, Drafter, common_prefix, draft_chain


def truncated_model(target: CausalLM, num_layers: int) -> CausalLM:
    """The target's embedding, first `num_layers` layers, final norm and lm_head, shared."""
    if not 1 <= num_layers <= target.config.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{target.config.num_hidden_layers}, got {num_layers}")
    config = dataclasses.replace(target.config, num_hidden_layers=num_layers)
    with torch.device("meta"):  # build the shell without allocating; every part is replaced below
        draft = CausalLM(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = nn.ModuleList(target.model.layers[:num_layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    return draft.eval()


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, draft: CausalLM):
        self.draft = draft
        self.generator = torch.Generator(device=draft.device)
        self.cache: KVCache | None = None
        self.cached_ids: list[int] = []  # the tokens whose K/V the draft cache holds

    def begin(self, seq: Sequence) -> None:
        self.generator.manual_seed(seq.sampler.seed + 1)  # not the acceptance draws' stream
        self.cached_ids = []

    @torch.no_grad()
    def propose(self, seq: Sequence, k: int) -> Draft:
        ids, params = seq.all_ids, seq.params
        if self.cache is None or self.cache.capacity < len(seq.prompt_ids) + params.max_new_tokens:
            self.cache = KVCache(self.draft.config, len(seq.prompt_ids) + params.max_new_tokens,
                                 self.draft.dtype, self.draft.device)
            self.cached_ids = []
        # keep the K/V of the prefix still valid, and recompute at least the last token (its logits)
        keep = min(common_prefix(self.cached_ids, ids), len(ids) - 1)
        self.cache.num_tokens = keep
        attn = ContiguousKVAttention(self.cache)
        logits = forward_step(self.draft, attn, ids[keep:])  # catch up
        draft = draft_chain(logits, lambda i, token: forward_step(self.draft, attn, [token]), k, seq,
                            self.generator)
        self.cached_ids = ids + draft.tokens[:-1]  # the last drafted token was never fed
        return draft
