"""OpenAI request bodies, validated. Unknown fields are refused (400), never silently ignored.

The bodies here are what every client sends: a text prompt, plain chat turns, the sampling
fields, `response_format`. A room adds its own fields with `with_fields` (tools/' `tools` and
`tool_choice`, harness/' token-id prompts and `prompt_logprobs`): its class comes first in the
mixed body, so it may redefine a field and extend a method (`chat_prompt`, `grammars`,
`response_shape`) with `super()`.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, create_model, model_validator

from course.s01_decode_loop.sampling import SamplingParams

from .responses import Shape

MAX_N = 16           # choices per request
MAX_LOGPROBS = 20    # alternatives per token (OpenAI's chat limit)
MAX_STOP = 16        # stop strings per request (OpenAI allows 4; each costs a check per token)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # a signed 64-bit seed (as vLLM); choice i uses seed + i
IGNORED_HEADER = "x-ignored-fields"  # names the fields a request sent that change nothing here


def find_lone_surrogate(value) -> str | None:
    """The path of the first string (or key) in a parsed JSON value holding a lone surrogate,
    else None. JSON may escape one ("\\ud800"), but no UTF-8 text can hold it: a tokenizer or
    grammar would fail on it later, so it is refused up front. Iterative: any depth is fine."""
    stack = [("body", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return path
        elif isinstance(v, dict):
            for k, item in v.items():
                stack.append((f"a key of {path}", k))
                key = k.encode("utf-8", "backslashreplace").decode() if isinstance(k, str) else k
                stack.append((f"{path}.{key}", item))  # the path itself must be valid text
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
    return None


def with_fields(body: type[BaseModel], *fields: type[BaseModel]) -> type[BaseModel]:
    """`body` with the `fields` classes mixed in front of it: their fields, validators and methods."""
    return create_model(body.__name__, __base__=(*fields, body), __module__=body.__module__) if fields else body


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False            # a last chunk with the usage of the whole request
    continuous_usage_stats: bool = False   # vLLM's: usage so far on every chunk (guidellm asks for it)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict | bool = Field(True, alias="schema")   # `schema` would shadow a pydantic method
    strict: bool | None = None   # true: refuse a schema we cannot enforce exactly; else best-effort (structured.py)


class ResponseFormat(BaseModel):
    """OpenAI's structured outputs: plain text, any JSON object, or JSON valid for a schema."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema', and only with it")
        return self


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[Annotated[str, Field(min_length=1)]] | None = Field(None, union_mode="left_to_right")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    ignore_eos: bool = False  # vLLM's extension: benchmarks use it to get exact output lengths
    # our extension: false = never drafted for (a server started with --speculative-method);
    # strict, so a string such as "false" is refused rather than guessed at
    speculative: StrictBool = True
    # vLLM's extension: with --scheduling-policy priority, lower values run first (ties by arrival)
    priority: StrictInt = Field(0, ge=-(2**63), le=2**63 - 1)
    user: str | None = None
    response_format: ResponseFormat | None = None  # also on completions, as vLLM allows

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data):
        path = find_lone_surrogate(data)
        if path is not None:
            raise ValueError(f"{path.removeprefix('body.')} holds a lone UTF-16 surrogate, which is not valid "
                             "Unicode text; send UTF-8")
        return data

    @model_validator(mode="after")
    def _few_stop_strings(self):
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop strings, got {len(self.stop)}")
        return self

    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the chosen token's and the k most likely."""
        raise NotImplementedError

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse (a FieldError, 400) a field naming a token the model does not have (compat/)."""

    def ignored_fields(self) -> list[str]:
        """Fields accepted that change nothing here, named back in a header (compat/)."""
        return []

    def uses_grammar(self) -> bool:
        """Whether every choice is held to a grammar (known before it is compiled)."""
        return self.response_format is not None and self.response_format.type != "text"

    async def grammars(self, cache, n: int, max_tokens: int) -> list | None:
        """One logits processor per choice, from the server's GrammarCache (None: unconstrained)."""
        return await cache.processors(self.response_format, n, max_tokens)

    def response_shape(self) -> type[Shape]:
        """The JSON the answer and its stream chunks take."""
        return Shape

    def sampling_params(self, max_tokens: int) -> list[SamplingParams]:
        """One SamplingParams per choice. With a seed, choice i uses seed + i (as vLLM does):
        reproducible, yet the n choices differ."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [SamplingParams(max_new_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                               top_k=self.top_k, min_p=self.min_p, presence_penalty=self.presence_penalty,
                               frequency_penalty=self.frequency_penalty,
                               repetition_penalty=self.repetition_penalty, stop=stop, ignore_eos=self.ignore_eos,
                               seed=None if self.seed is None else self.seed + i, logprobs=self.num_logprobs())
                for i in range(self.n)]


class CompletionRequest(_Common):
    prompt: str
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def num_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat turn. `developer` is OpenAI's newer name for `system`."""
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]  # guidellm and others send a list of parts
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The turn as a chat template reads it (`developer` is sent as `system` to every template)."""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text()} | ({"name": self.name} if self.name else {})


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat_prompt(self, tokenizer) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools) for the chat template: each turn's role and text, no tools."""
        return [m.for_template() for m in self.messages], None

    def template_kwargs(self) -> dict:
        """More variables for the chat template (reasoning/' chat_template_kwargs)."""
        return {}
