"""The body of POST /v1/responses, validated: each field of OpenAI's Responses API is honoured,
accepted and named back (`x-ignored-fields`), or refused by name. Unknown fields are refused."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator,
                      model_validator)

from ..protocol import find_lone_surrogate

# accepted as OpenAI's API does, but they change nothing here
IGNORED_FIELDS = ("include", "truncation", "user", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
                  "service_tier", "reasoning", "top_logprobs", "stream_options", "max_tool_calls")
REFUSED = {"background": "background responses are not supported: the request waits for its answer",
           "conversation": "this server keeps no conversations: continue one with previous_response_id",
           "prompt": "stored prompt templates are OpenAI's: send input and instructions"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list = []          # an earlier answer's part, sent back as it came
    logprobs: list | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, part):
        if isinstance(part, dict) and part.get("type") not in ("input_text", "output_text"):
            raise ValueError(f"{part.get('type')} parts are not supported: this server reads text only")
        return part


def as_parts(content):
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content


Text = Annotated[list[TextPart], BeforeValidator(as_parts)]  # a string is one part


class _Item(_Strict):
    id: str | None = None           # set on an earlier answer's items, sent back as they came
    status: str | None = None


class MessageItem(_Item):
    type: Literal["message"] = "message"   # the type may be left out of a message
    role: Literal["user", "system", "developer", "assistant"]
    content: Text


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str                  # a JSON object, as a string


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: Text


class ReasoningItem(BaseModel):
    """An earlier answer's reasoning, sent back by agents: accepted and left out of the prompt
    (the model's own thoughts are not part of the conversation), so its fields are not read."""
    type: Literal["reasoning"]


ITEMS = {"message": MessageItem, "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem,
         "reasoning": ReasoningItem}


def item_type(item) -> str:
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")


Item = Annotated[Union[tuple(Annotated[cls, Tag(name)] for name, cls in ITEMS.items())], Discriminator(item_type)]


class FunctionTool(_Strict):
    """Responses' flat function tool (chat nests the same fields under `function`)."""
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None      # as in chat: true refuses a schema that cannot be enforced exactly


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.schema_ is not None and self.name is not None):
            raise ValueError("name and schema are required with type 'json_schema', and only with it")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = None    # accepted, changes nothing


class ResponsesRequest(_Strict):
    input: list[Item]               # a string is one user message
    instructions: str | None = None
    model: str | None = None
    tools: list[FunctionTool] = []
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False        # REFUSED when true, like conversation and prompt
    conversation: object = None
    prompt: object = None
    include: list[str] | None = None   # the IGNORED_FIELDS from here on
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    reasoning: dict | None = None
    top_logprobs: int | None = None
    stream_options: dict | None = None
    max_tool_calls: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode_and_null_is_the_default(cls, data):
        if (path := find_lone_surrogate(data)) is not None:
            raise ValueError(f"{path.removeprefix('body.')} holds a lone UTF-16 surrogate; send UTF-8 text")
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, items):
        for i, item in enumerate(items if isinstance(items, list) else []):
            if item_type(item) not in ITEMS:
                raise ValueError(f"input[{i}]: {item_type(item)!r} items are not supported here; send "
                                 f"{', '.join(ITEMS)} items")
        return [{"role": "user", "content": items}] if isinstance(items, str) else items

    @field_validator("tools", mode="before")
    @classmethod
    def _flat_function_tools(cls, tools):
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise ValueError(f"tools[{i}]: {kind} tools are not supported by this server; only function tools")
            if kind == "function" and "function" in tool:
                raise ValueError(f"tools[{i}]: Responses' function tools are flat, {{\"type\": \"function\", "
                                 "\"name\": ..., \"parameters\": ...}, not nested under \"function\" as in chat")
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, choice):
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise ValueError(f"{choice.get('type')!r} is not supported here; send none, auto, required or "
                             '{"type": "function", "name": ...}')
        return choice

    @field_validator(*REFUSED)
    @classmethod
    def _refused(cls, value, info):
        if value:
            raise ValueError(REFUSED[info.field_name])
        return value

    def ignored_fields(self) -> list[str]:
        """Named back in x-ignored-fields (`reasoning` with an effort: if chat ignores that effort)."""
        effort = bool((self.reasoning or {}).get("effort"))
        named = [name for name in IGNORED_FIELDS
                 if name in self.model_fields_set and not (name == "reasoning" and effort)]
        return named + ["text.verbosity"] * bool(self.text and self.text.verbosity)
