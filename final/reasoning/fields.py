"""The reasoning fields of a chat request (vLLM's names), mixed into the server's chat body, and
what they change: the template's variables, the grammar (gated by the thinking) and the answer's
shape (the reasoning split out)."""
from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator

from course.s08_structured.reasoning import ThinkingGate

from .shape import reasoning_shape

# reasoning_effort as thinking tokens (vLLM's default budgets for low, medium and high)
EFFORT_BUDGETS = {"none": 0, "minimal": 256, "low": 1024, "medium": 2048, "high": 8192, "xhigh": 16384}

# The chat template's own arguments: a request may not set them through chat_template_kwargs.
RESERVED = {"messages", "tools", "documents", "tokenize", "add_generation_prompt", "continue_final_message",
            "return_dict", "return_tensors", "chat_template", "tokenizer_kwargs"}


class ReasoningFields(BaseModel):
    chat_template_kwargs: dict[str, Any] | None = None    # extra template variables: {"enable_thinking": false}
    thinking_token_budget: int | None = Field(None, ge=0)  # thinking tokens before the end tag is forced
    _thinking: Any = PrivateAttr(None)  # the request's RequestThinking, set once its prompt is rendered

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_the_templates_own(cls, value):
        if value and (taken := sorted(RESERVED & set(value))):
            raise ValueError(f"chat_template_kwargs may not set {', '.join(taken)}: the server sets them")
        return value

    @model_validator(mode="after")
    def _known_effort(self):
        effort = getattr(self, "reasoning_effort", None)  # compat/'s field
        if effort is not None and effort not in EFFORT_BUDGETS:
            raise ValueError(f"reasoning_effort: one of {', '.join(EFFORT_BUDGETS)}, not {effort!r}")
        return self

    def budget(self) -> int | None:
        """Thinking tokens before the end tag is forced: thinking_token_budget, else reasoning_effort's."""
        if self.thinking_token_budget is not None:
            return self.thinking_token_budget
        return EFFORT_BUDGETS.get(getattr(self, "reasoning_effort", None))

    def ignored_fields(self) -> list[str]:
        return [f for f in super().ignored_fields() if f != "reasoning_effort"]  # it sets the budget here

    def template_kwargs(self) -> dict:
        return {**super().template_kwargs(), **(self.chat_template_kwargs or {})}

    def waits_for_thinking(self) -> bool:
        """Whether something must happen where the thinking ends: a grammar, or a budget."""
        return super().uses_grammar() or self.budget() is not None

    def set_thinking(self, thinking) -> None:
        self._thinking = thinking

    def uses_grammar(self) -> bool:  # a budget is a logits processor too (so a server that cannot run one refuses)
        gated = self._thinking is not None and self._thinking.open and self.budget() is not None
        return super().uses_grammar() or gated

    async def grammars(self, cache, n: int, max_tokens: int) -> list | None:
        processors = await super().grammars(cache, n, max_tokens)
        thinking = self._thinking
        if thinking is None or not thinking.open or (processors is None and self.budget() is None):
            return processors  # nothing to wait for: a grammar holds from the first token
        end = await asyncio.to_thread(thinking.server.end_of_thinking)
        return [ThinkingGate(end, p, budget=self.budget(), max_new_tokens=max_tokens)
                for p in processors or [None] * n]

    def response_shape(self):
        shape = super().response_shape()
        thinking = self._thinking
        return shape if thinking is None else reasoning_shape(shape, thinking.tags, thinking.open)
