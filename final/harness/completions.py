"""/v1/completions as evaluation harnesses call it, on top of the server's one-prompt `respond`
(`Server.complete` and `Server.answer_chat`, taken over by this room's plug-in).

lm-evaluation-harness's `local-completions` scores a continuation by sending the context and
continuation as one prompt with `echo: true, logprobs: 1` and a short or zero `max_tokens`,
many prompts per request, often as token ids. Each prompt runs as the server's ordinary
request (`respond`); their choices are put together here, in OpenAI's order:

    choice index = prompt index * n + choice    (text: prompt + answer with echo)
    logprobs     = the prompt's (the first token's logprob is null), then the answer's

The prompt's logprobs come from the engine's prefill (prompt_logprobs.py). vLLM's
`prompt_logprobs` gives the same numbers in vLLM's shape: per choice on completions, once
per response on chat (`Completions.chat`).
"""
from __future__ import annotations

import asyncio
import itertools
import json

from fastapi.responses import JSONResponse

from .fields import prompts_of
from .prompt_logprobs import PromptRow, scored


class OnePrompt:
    """The request body as `respond` sees it for one prompt: its fields, no stream, and a first
    choice that also scores the prompt when `k` is set (the engine fills `rows`)."""
    stream = False

    def __init__(self, body, k: int | None):
        self._body, self.k, self.rows = body, k, []

    def __getattr__(self, name):
        return getattr(self._body, name)

    def sampling_params(self, max_tokens: int):
        params = self._body.sampling_params(max_tokens)
        if self.k is not None:
            params[0] = scored(params[0], self.k, self.rows)
        return params


def answer_of(result) -> tuple[dict | None, dict]:
    """`respond`'s result as (its JSON, headers to keep), or (None, {}) when it is an error."""
    if isinstance(result, dict):
        return result, {}
    if result.status_code != 200:
        return None, {}
    return json.loads(result.body), {k: v for k, v in result.headers.items() if k.startswith("x-")}


class Completions:
    """The completions route's answer, and the chat route's with prompt logprobs: the plain case
    goes straight to the server's `respond`, the rest prompt by prompt."""

    def __init__(self, server):
        self.engine, self.tokenizer, self.respond = server.engine, server.tokenizer, server.respond
        self.off_loop, self.check_length = server.off_loop, server.check_length

    async def __call__(self, body):
        prompts = prompts_of(body.prompt)
        self.engine.check_room(body.n * len(prompts))  # a full queue answers 429 before any tokenizing
        ids = [await self.token_ids(p) for p in prompts]
        if len(prompts) == 1 and not body.echo and body.prompt_logprobs is None:
            return await self.respond(body, ids[0], body.max_tokens, "text_completion")
        max_len, max_tokens = self.engine.limits.max_model_len, max(1, body.max_tokens)
        for i, prompt_ids in enumerate(ids):  # refuse before anything runs
            if len(prompt_ids) + max_tokens > max_len:
                raise ValueError(f"prompt[{i}]: {len(prompt_ids)} tokens plus max_tokens={max_tokens} exceed this "
                                 f"model's maximum context length of {max_len} tokens")
        k = body.prompt_logprobs  # alternatives per prompt position: the most either field asks for
        if body.echo and body.logprobs is not None:
            k = max(k or 0, body.logprobs)
        bodies = [OnePrompt(body, k) for _ in prompts]
        results = await asyncio.gather(*(self.respond(b, i, max_tokens, "text_completion")
                                         for b, i in zip(bodies, ids)))
        answers = []
        for result in results:
            answer, headers = answer_of(result)
            if answer is None:
                return result  # the first failure, as the server would send it for that prompt alone
            answers.append(answer)
        return self.combine(body, prompts, ids, bodies, answers, headers)

    async def token_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            self.check_length(len(prompt))
            return await self.off_loop(lambda: self.tokenizer(prompt).input_ids)
        vocab = self.engine.limits.vocab_size
        if bad := [t for t in prompt if t >= vocab]:
            raise ValueError(f"prompt: token id {bad[0]} is not in this model's vocabulary (0..{vocab - 1})")
        return list(prompt)

    def combine(self, body, prompts, ids, bodies, answers, headers):
        """One response: every prompt's choices, re-indexed and echoed as asked."""
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for p, (prompt, prompt_ids, one, answer) in enumerate(zip(prompts, ids, bodies, answers)):
            text = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt_ids)
            for choice in answer["choices"]:
                if body.max_tokens == 0:  # scored only: the one token generated is not part of the answer
                    choice.update(text="", logprobs=None, finish_reason="length")
                if body.echo:
                    echoed = self.echo_logprobs(prompt_ids, one.rows) if body.logprobs is not None else None
                    choice["logprobs"] = join_logprobs(echoed, choice["logprobs"], len(text))
                    choice["text"] = text + choice["text"]
                if body.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self.vllm_prompt_logprobs(one.rows)
                choice["index"] = p * body.n + choice["index"]
                choices.append(choice)
            used = answer["usage"]
            generated = 0 if body.max_tokens == 0 else used["completion_tokens"]
            usage["prompt_tokens"] += used["prompt_tokens"]
            usage["completion_tokens"] += generated
            usage["total_tokens"] += used["prompt_tokens"] + generated
        whole = answers[0] | {"choices": choices, "usage": usage}
        return JSONResponse(whole, headers=headers) if headers else whole

    async def chat(self, body, ids: list[int], max_tokens: int):
        """A chat answer, with vLLM's `prompt_logprobs` (of the rendered template) when asked."""
        if body.prompt_logprobs is None:
            return await self.respond(body, ids, max_tokens, "chat.completion")
        one = OnePrompt(body, body.prompt_logprobs)
        answer, headers = answer_of(result := await self.respond(one, ids, max_tokens, "chat.completion"))
        if answer is None:
            return result
        answer["prompt_logprobs"] = self.vllm_prompt_logprobs(one.rows)
        return JSONResponse(answer, headers=headers) if headers else answer

    def echo_logprobs(self, prompt_ids: list[int], rows: list[PromptRow]) -> dict:
        """OpenAI's completions logprobs of the prompt: the first token has none."""
        token = lambda i: self.tokenizer.decode([i])  # noqa: E731
        tokens = [token(i) for i in prompt_ids]
        return {"tokens": tokens, "token_logprobs": [None] + [r.logprob for r in rows],
                "top_logprobs": [None] + [{token(i): lp for i, lp in r.top} for r in rows],
                "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0))}

    def vllm_prompt_logprobs(self, rows: list[PromptRow]) -> list:
        """vLLM's shape: None for the first token, then {token id: {logprob, rank, decoded_token}}
        holding the prompt's token and the k most likely."""
        def entry(token_id: int, lp: float, rank: int) -> dict:
            return {"logprob": lp, "rank": rank, "decoded_token": self.tokenizer.decode([token_id])}
        out = [None]
        for r in rows:
            top = {str(i): entry(i, lp, rank) for rank, (i, lp) in enumerate(r.top, start=1)}
            out.append(top | {str(r.token_id): entry(r.token_id, r.logprob, r.rank)})
        return out


def join_logprobs(prompt: dict | None, answer: dict | None, shift: int) -> dict | None:
    """The prompt's logprobs, then the answer's (its text offsets moved past the echoed prompt)."""
    if prompt is None:
        return answer
    if answer is None:
        return prompt
    return {"tokens": prompt["tokens"] + answer["tokens"],
            "token_logprobs": prompt["token_logprobs"] + answer["token_logprobs"],
            "top_logprobs": prompt["top_logprobs"] + answer["top_logprobs"],
            "text_offset": prompt["text_offset"] + [o + shift for o in answer["text_offset"]]}
