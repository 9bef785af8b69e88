"""ShareGPT traces for the scheduling evaluation: real prompt and answer lengths (heavy-tailed:
most answers are short, a few are very long), chat-templated, arriving as a Poisson process."""
from __future__ import annotations

from course.s01_decode_loop.bench.workloads import arrival_times, sample_requests

from .simulator import TraceRequest


def chat_overhead(tokenizer) -> int:
    """Tokens the chat template adds around one user message (SmolLM2's adds a system prompt)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                             add_generation_prompt=True)
    return len(tokenizer(rendered, add_special_tokens=False).input_ids) - 1


def sharegpt_lengths(tokenizer, n: int, seed: int = 0, max_prompt_tokens: int = 1024,
                     max_output_tokens: int = 1024) -> list[tuple[int, int]]:
    """(prompt tokens with the chat template, answer tokens) of n ShareGPT requests."""
    requests = sample_requests(tokenizer, n, seed, max_prompt_tokens, max_output_tokens)
    prompts = tokenizer([r.prompt for r in requests], add_special_tokens=False).input_ids
    overhead = chat_overhead(tokenizer)
    return [(len(p) + overhead, r.output_len) for p, r in zip(prompts, requests)]


def poisson_trace(lengths: list[tuple[int, int]], rate: float, seed: int = 0) -> list[TraceRequest]:
    return [TraceRequest(t, p, o) for t, (p, o) in zip(arrival_times(len(lengths), rate, seed), lengths)]
