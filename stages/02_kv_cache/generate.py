"""The cached loop: prefill once, then decode one token per forward.

    prefill:  the whole prompt in one forward  -> K/V of every prompt token cached, first token
    decode:   one token in, one token out      -> its K/V appended, next token

The token ids equal stage 01's naive loop (tested); the work per step drops from O(position)
token-forwards to one.
"""
from __future__ import annotations

from typing import Iterator

import torch

from course.s01_decode_loop.attention import AttentionMetadata
from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import GenerationOutput, Sequence, TokenEvent

from .kv_cache import CacheCapacityError, ContiguousKVAttention, KVCache


def step_metadata(start: int, num_new: int, device) -> AttentionMetadata:
    """Metadata for one sequence: `num_new` tokens at positions start .. start+num_new-1."""
    return AttentionMetadata(positions=torch.arange(start, start + num_new, device=device),
                             cu_seqlens_q=torch.tensor([0, num_new], device=device),
                             seq_lens=torch.tensor([start + num_new], device=device))


@torch.no_grad()
def forward_step(model: CausalLM, attn: ContiguousKVAttention, token_ids: list[int]) -> torch.Tensor:
    """Run `token_ids` (the prompt at prefill, one token at decode) after what is cached;
    return the logits for the next token."""
    start = attn.cache.num_tokens
    ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
    hidden = model(ids, attn, step_metadata(start, len(token_ids), model.device))
    return model.compute_logits(hidden[-1:])[0]


def check_max_len(seq: Sequence, limit: int) -> int:
    """The longest `seq` can grow; refuse it (before any compute) if that exceeds `limit`."""
    need = len(seq.prompt_ids) + seq.params.max_new_tokens
    if need > limit:
        raise CacheCapacityError(
            f"prompt ({len(seq.prompt_ids)} tokens) + max_new_tokens ({seq.params.max_new_tokens}) = {need} "
            f"exceeds the maximum sequence length of {limit} tokens; shorten the prompt or lower max_new_tokens")
    return need


def reserve_cache(model: CausalLM, seq: Sequence, max_model_len: int | None = None) -> KVCache:
    """Reserve K/V for the longest this request can grow, or refuse it before any compute."""
    need = check_max_len(seq, max_model_len or model.config.max_position_embeddings)
    return KVCache(model.config, need, dtype=model.dtype, device=model.device)


def stream_cached(model: CausalLM, seq: Sequence, max_model_len: int | None = None) -> Iterator[TokenEvent]:
    attn = ContiguousKVAttention(reserve_cache(model, seq, max_model_len))
    logits = forward_step(model, attn, seq.prompt_ids)  # prefill
    while True:
        event = seq.sample_and_append(logits)
        yield event
        if seq.finished:
            return
        logits = forward_step(model, attn, [event.token_id])  # decode


def generate_cached(model: CausalLM, tokenizer, prompt_ids: list[int], params: SamplingParams,
                    eos_token_ids=()) -> GenerationOutput:
    return run_to_end(stream_cached, model, tokenizer, prompt_ids, params, eos_token_ids)
