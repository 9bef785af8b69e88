"""The request fields evaluation harnesses send, mixed into protocol.py's request bodies.

Completions: `prompt` as a string, token ids, a list of strings or a list of token-id lists
(one choice per prompt); `echo` (the prompt, and its logprobs, before the answer); `max_tokens: 0`
with `echo` (score only, as OpenAI's legacy API allowed); `prompt_logprobs` (vLLM's name), also
on chat. Kept apart so protocol.py stays about what every client sends.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictInt, model_validator

MAX_PROMPTS = 1024          # prompts in one completions request
MAX_PROMPT_LOGPROBS = 20    # alternatives per prompt position (vLLM's default max_logprobs)

TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
Prompt = str | TokenIds | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)] | \
    Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]


class PromptLogprobsField(BaseModel):
    # vLLM's: the logprob of every prompt token after the first, and the k most likely there
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_PROMPT_LOGPROBS)

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self):
        if self.prompt_logprobs is not None and self.stream:  # as vLLM: they come with the whole answer
            raise ValueError("prompt_logprobs: not available with stream=true")
        return self


class HarnessCompletionFields(PromptLogprobsField):
    prompt: Prompt = Field(union_mode="left_to_right")
    max_tokens: int = Field(16, ge=0)  # 0 only with echo: score the prompt, generate nothing
    echo: bool = False                 # the prompt (and its logprobs) first in each choice

    @model_validator(mode="after")
    def _harness_rules(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 is allowed only with echo=true (scoring the prompt)")
        if self.stream and (self.echo or not isinstance(self.prompt, str) and prompts_of(self.prompt)[1:]):
            raise ValueError("stream: not supported with echo or with several prompts; send stream=false")
        return self


def prompts_of(prompt) -> list:
    """The request's prompts, each a string or a list of token ids."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)
