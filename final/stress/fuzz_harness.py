"""The fuzz table's rows for what evaluation harnesses send (harness/): prompts as token ids or
lists, echo, max_tokens 0, prompt_logprobs, /tokenize and /detokenize. fuzz.py sends them after
its own HOSTILE rows, with the same checks (below 500, OpenAI's error shape, in time)."""
from __future__ import annotations

CHAT, COMPLETIONS, TOKENIZE, DETOKENIZE = "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"
USER = [{"role": "user", "content": "hi"}]
SCORE = {"echo": True, "logprobs": 1, "max_tokens": 0}

HARNESS_HOSTILE: list[tuple[str, str, object]] = [
    ("token id past the vocabulary", COMPLETIONS, {"prompt": [1, 10**6]}),
    ("token id 2**70", COMPLETIONS, {"prompt": [2**70]}),
    ("negative token id", COMPLETIONS, {"prompt": [-1]}),
    ("float token id", COMPLETIONS, {"prompt": [1.0]}),
    ("bool token ids", COMPLETIONS, {"prompt": [True, False]}),
    ("empty token list", COMPLETIONS, {"prompt": []}),
    ("empty prompt in a list", COMPLETIONS, {"prompt": ["x", ""], **SCORE}),
    ("empty token list in a list", COMPLETIONS, {"prompt": [[1], []]}),
    ("mixed prompt list", COMPLETIONS, {"prompt": ["x", [1, 2]]}),
    ("prompt lists nested 3 deep", COMPLETIONS, {"prompt": [[[1]]]}),
    ("2000 prompts", COMPLETIONS, {"prompt": ["x"] * 2000, **SCORE}),
    ("1000 prompts, n 16", COMPLETIONS, {"prompt": ["x"] * 1000, "n": 16, "max_tokens": 1}),
    ("100000 token ids", COMPLETIONS, {"prompt": [1] * 100_000, **SCORE}),
    ("one long prompt among short", COMPLETIONS, {"prompt": ["x", "y" * 5000], **SCORE}),
    ("scores 64 prompts", COMPLETIONS, {"prompt": [[1, 2, 3, 4]] * 64, **SCORE, "logprobs": 20}),
    ("max_tokens 0 without echo", COMPLETIONS, {"prompt": "x", "max_tokens": 0}),
    ("echo streamed", COMPLETIONS, {"prompt": "x", "echo": True, "stream": True}),
    ("prompt list streamed", COMPLETIONS, {"prompt": ["x", "y"], "stream": True}),
    ("prompt_logprobs streamed", COMPLETIONS, {"prompt": "x", "prompt_logprobs": 1, "stream": True}),
    ("prompt_logprobs 21", COMPLETIONS, {"prompt": "x", "prompt_logprobs": 21}),
    ("prompt_logprobs -1", CHAT, {"messages": USER, "prompt_logprobs": -1}),
    ("prompt_logprobs string", CHAT, {"messages": USER, "prompt_logprobs": "all"}),
    ("echo with a schema", COMPLETIONS, {"prompt": ["a", "b"], **SCORE, "max_tokens": 2,
                                         "response_format": {"type": "json_object"}}),
    ("echo, one-token prompt", COMPLETIONS, {"prompt": [5], **SCORE}),
    ("tokenize giant prompt", TOKENIZE, {"prompt": "word " * 200_000}),
    ("tokenize prompt and messages", TOKENIZE, {"prompt": "x", "messages": USER}),
    ("tokenize no messages", TOKENIZE, {"messages": []}),
    ("tokenize surrogate", TOKENIZE, '{"prompt": "\\ud800"}'),
    ("detokenize past the vocabulary", DETOKENIZE, {"tokens": [10**9]}),
    ("detokenize 2**70", DETOKENIZE, {"tokens": [2**70]}),
    ("detokenize strings", DETOKENIZE, {"tokens": ["a"]}),
]
