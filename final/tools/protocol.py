"""The chat fields agents send: every role, tools, tool_choice, mixed into the server's chat body
(`plug_in`, with protocol.py's `with_fields`). Unknown fields are refused, and each refusal names
the field (a 400 in OpenAI's error shape)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..protocol import Message, TextPart
from . import grammars, render
from .shape import ToolShape

MAX_TOOLS = 128      # functions per request; each one is compiled into the call grammar
NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names (so a name needs no escaping)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str   # a JSON object, as a string (as OpenAI sends it)


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolMessage(Message):
    """A chat turn of an agent's conversation: a `tool` result, or an assistant's earlier calls."""
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None      # an assistant's earlier calls
    tool_call_id: str | None = None               # a tool's result answers this call

    @model_validator(mode="after")
    def _fields_of_the_role(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a message with role 'tool' must say which call it answers")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message may hold tool calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content: required, except in an assistant message with tool_calls")
        return self


class FunctionDef(_Strict):
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict | None = None   # a JSON schema; none: no arguments
    strict: bool | None = None       # true: refuse a schema we cannot enforce exactly; else best-effort


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ToolFields(BaseModel):
    """The tool fields of a chat request, and what they change: the prompt, the grammar, the answer."""
    messages: list[ToolMessage] = Field(min_length=1)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _choice_among_the_tools(self):
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: two functions share a name")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no function named {choice.function.name!r} in tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice: 'required' needs tools")
        if self.tool_mode() not in (None, "none") and getattr(self, "response_format", None) is not None \
                and self.response_format.type != "text":
            raise ValueError("response_format: cannot be combined with tools unless tool_choice is 'none'")
        return self

    def tool_mode(self) -> str | None:
        """None (no tools), "none", "auto", "required" or "named" (OpenAI's default is auto)."""
        if not self.tools:
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    def calls_tools(self) -> bool:
        return self.tool_mode() in ("auto", "required", "named")

    def chat_prompt(self, tokenizer) -> tuple[list[dict], list[dict] | None]:
        return render.chat_prompt(self, tokenizer)  # roles, tools and their results

    def uses_grammar(self) -> bool:
        return self.calls_tools() or super().uses_grammar()

    async def grammars(self, cache, n: int, max_tokens: int) -> list | None:
        if not self.calls_tools():
            return await super().grammars(cache, n, max_tokens)
        return await grammars.call_grammars(cache, self, n, max_tokens)

    def response_shape(self):
        return ToolShape if self.calls_tools() else super().response_shape()  # tagged text becomes tool_calls
