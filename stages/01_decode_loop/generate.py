"""The naive decode loop: at every step, run the model over the *whole* sequence again.

It is wasteful on purpose: step n redoes the work of steps 1..n-1, so generating N tokens
costs O(N^2) token-forwards. It is also obviously correct, which makes it the reference
every later stage is compared with, token for token.
"""
from __future__ import annotations

from typing import Iterator

import torch

from .attention import AttentionMetadata, FullCausalAttention
from .model import CausalLM
from .sampling import SamplingParams
from .sequence import GenerationOutput, Sequence, TokenEvent


@torch.no_grad()
def next_token_logits(model: CausalLM, token_ids: list[int]) -> torch.Tensor:
    """One full forward over `token_ids`; the logits that predict the next token ([vocab])."""
    if len(token_ids) > model.config.max_position_embeddings:  # past it the model is not what we compute
        raise ValueError(f"the sequence ({len(token_ids)} tokens) exceeds the longest this model takes, "
                         f"{model.config.context_limit}")
    ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
    meta = AttentionMetadata.for_full_sequences([len(token_ids)], device=model.device)
    hidden = model(ids, FullCausalAttention(model.config.layer_windows), meta)
    return model.compute_logits(hidden[-1:])[0]


def stream_naive(model: CausalLM, seq: Sequence) -> Iterator[TokenEvent]:
    """Generate one token per full forward pass until `seq` finishes, yielding each token
    with its text delta."""
    while not seq.finished:
        yield seq.sample_and_append(next_token_logits(model, seq.all_ids))


def run_to_end(stream_fn, model: CausalLM, tokenizer, prompt_ids: list[int], params: SamplingParams,
               eos_token_ids=()) -> GenerationOutput:
    """Drive any stage's `stream_fn(model, seq)` to the end and return the whole output."""
    seq = Sequence(prompt_ids, params, tokenizer, eos_token_ids)
    for _ in stream_fn(model, seq):
        pass
    return seq.output()


def generate_naive(model: CausalLM, tokenizer, prompt_ids: list[int], params: SamplingParams,
                   eos_token_ids=()) -> GenerationOutput:
    return run_to_end(stream_naive, model, tokenizer, prompt_ids, params, eos_token_ids)


def encode_prompt(tokenizer, text: str, chat: bool = False, system: str | None = None) -> list[int]:
    """Token ids for a prompt. With chat=True the tokenizer's own chat template wraps it as a
    user message and opens the assistant's turn, which is what instruct models expect."""
    if not chat:
        return tokenizer(text).input_ids
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False).input_ids
