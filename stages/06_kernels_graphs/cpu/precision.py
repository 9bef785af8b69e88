"""How close a lower-precision model is to float32: the two checks bench_precision and the tests use.

  top-1 agreement  teacher-forced: float32's greedy continuation fed to both models; at each
                   position, does the other model's argmax equal float32's? (Greedy runs part
                   for good at the first flip, so a free-running comparison says little.)
  perplexity       exp(mean NLL) of held-out text, each model scoring the same tokens.
"""
from __future__ import annotations

import math

import torch

from course.s01_decode_loop.attention import FullCausalAttention, AttentionMetadata


@torch.no_grad()
def all_logits(model, token_ids: list[int], attention=None) -> torch.Tensor:
    """[T, vocab] float32: the logits after every prefix of `token_ids`, one full forward
    (through `attention`, a full causal attention backend; default stage 01's)."""
    ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
    meta = AttentionMetadata.for_full_sequences([len(token_ids)], model.device)
    return model.compute_logits(model(ids, attention or FullCausalAttention(), meta)).float()


def top1_agreement(reference, other, prompt: list[int], continuation: list[int], attention=None) -> float:
    """Share of the continuation's positions where `other` (through `attention`) predicts what
    `reference` does."""
    ids = prompt + continuation
    rows = slice(len(prompt) - 1, len(ids) - 1)  # the rows that predict each continuation token
    want = all_logits(reference, ids)[rows].argmax(-1)
    got = all_logits(other, ids, attention)[rows].argmax(-1)
    return (want == got).float().mean().item()


def perplexity(model, texts: list[list[int]], attention=None) -> float:
    nll, count = 0.0, 0
    for ids in texts:
        logp = torch.log_softmax(all_logits(model, ids, attention)[:-1], dim=-1)
        nll -= logp.gather(1, torch.tensor(ids[1:], device=logp.device)[:, None]).sum().item()
        count += len(ids) - 1
    return math.exp(nll / count)
