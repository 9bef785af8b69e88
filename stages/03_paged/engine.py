"""Stage 03's generator: stage 02's prefill/decode loop over a paged, prefix-cached pool.

One request at a time still (batching is stage 04), but the pool outlives requests: a new
request whose prompt starts like an earlier one skips the cached blocks in its prefill.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import torch

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sequence import Sequence, TokenEvent
from course.s02_kv_cache.generate import check_max_len

from .block_manager import BlockManager, NoFreeBlocksError
from .paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache
from .quantized_kv import storage_dtype


def check_fits(seq: Sequence, max_model_len: int, blocks: BlockManager) -> None:
    """Refuse, before any compute or allocation, a request that can never fit: longer than the
    model's context, or needing more blocks than the whole pool has."""
    need = check_max_len(seq, max_model_len)
    if blocks.blocks_needed(need) > blocks.num_blocks:
        raise NoFreeBlocksError(f"{need} tokens need {blocks.blocks_needed(need)} KV blocks of "
                                f"{blocks.block_size}; the pool has {blocks.num_blocks}")


class PagedGenerator:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int = 16,
                 enable_prefix_caching: bool = True, max_model_len: int | None = None, kv_cache_dtype: str = "auto"):
        self.model = model
        self.cache = PagedKVCache(model.config, num_blocks, block_size, dtype=model.dtype, device=model.device,
                                  kv_dtype=storage_dtype(kv_cache_dtype, model.dtype))  # int8, fp8: quantized_kv.py
        self.attn = PagedAttention(self.cache)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_model_len = max_model_len or model.config.max_position_embeddings
        self.computed_prompt_tokens = 0
        self._ids = itertools.count()

    def check_fits(self, seq: Sequence) -> None:
        check_fits(seq, self.max_model_len, self.blocks)

    @torch.no_grad()
    def _forward(self, seq_id: int, token_ids: list[int], start: int) -> torch.Tensor:
        meta = PagedAttentionMetadata.build([(start, len(token_ids), self.blocks.tables[seq_id])],
                                            self.cache.block_size, self.model.device)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.model.device)
        return self.model.compute_logits(self.model(ids, self.attn, meta)[-1:])[0]

    def __call__(self, model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
        """The stage CLI's `stream_fn(model, seq)`: prefill what is not cached, then decode."""
        assert model is self.model
        self.check_fits(seq)
        seq_id = next(self._ids)
        cached = self.blocks.allocate(seq_id, seq.prompt_ids)
        try:
            self.computed_prompt_tokens += len(seq.prompt_ids) - cached
            logits = self._forward(seq_id, seq.prompt_ids[cached:], cached)  # prefill the rest
            self.blocks.commit(seq_id, seq.prompt_ids)
            while True:
                event = seq.sample_and_append(logits)
                yield event
                if seq.finished:
                    return
                n = len(seq.all_ids)
                self.blocks.append_slot(seq_id, n)
                logits = self._forward(seq_id, [event.token_id], n - 1)  # decode
                self.blocks.commit(seq_id, seq.all_ids)
        finally:
            self.blocks.free(seq_id)  # also when the consumer stops early: nothing leaks

    def stats(self) -> dict:
        b = self.blocks
        return {"num_blocks": b.num_blocks, "block_size": b.block_size, "free_blocks": b.num_free_blocks,
                "cached_blocks": len(b.hash_to_block), "prompt_tokens": b.prompt_tokens,
                "prefix_hit_tokens": b.prefix_hit_tokens, "computed_prompt_tokens": self.computed_prompt_tokens}
