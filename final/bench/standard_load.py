"""The standard serving load: vLLM's ShareGPT benchmark, as `vllm.benchmarks.serve` shapes it.

    vllm bench serve --dataset-name sharegpt --sharegpt-output-len 128 --ignore-eos --num-prompts 40

takes the first turn of ShareGPT conversations of two turns or more as a raw completion prompt
(no chat template; whoever speaks first, which in the many records that continue a split chat
is the model's long answer), keeps prompts of 4 to 1,024 tokens whose prompt + output fits 2,048, and asks every
request for exactly 128 tokens. On the default model the prompts average ~236 tokens, nearly
three times the light load's ~85 (which keeps only questions whose real answer fits 128 tokens):
the load where prefill, not decode, fills most of a step. `bench/peers.py` drives servers with
vLLM's own client; this module gives the same shape to the in-process benchmarks (`profile`).
"""
from __future__ import annotations

import random

from course.s01_decode_loop.bench.workloads import load_conversations

MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS, OUTPUT_TOKENS = 1024, 2048, 128


def standard_requests(tokenizer, n: int = 40, seed: int = 0, output_len: int = OUTPUT_TOKENS,
                      conversations: list[list[dict]] | None = None) -> list[tuple[str, int]]:
    """`n` (prompt text, output length) pairs: the requests vLLM's client sends for this seed."""
    conversations = [c for c in (load_conversations() if conversations is None else conversations) if len(c) >= 2]
    random.Random(seed).shuffle(conversations)  # vLLM's order: random.seed(seed), then random.shuffle
    requests = []
    for turns in conversations:
        prompt = turns[0]["value"]
        prompt_len = len(tokenizer(prompt).input_ids)
        if 4 <= prompt_len <= MAX_PROMPT_TOKENS and prompt_len + output_len <= MAX_TOTAL_TOKENS:
            requests.append((prompt, output_len))
            if len(requests) == n:
                return requests
    raise ValueError(f"only {len(requests)} conversations fit vLLM's ShareGPT filters; ask for fewer")
