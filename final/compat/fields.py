"""The fields (compat/'s docstring says which and why), mixed in front of a request body."""
from __future__ import annotations

import torch
from pydantic import BaseModel, field_validator, model_validator

from ..errors import FieldError
from ..protocol import IGNORED_HEADER  # noqa: F401 - compat/ names it too

MAX_LOGIT_BIAS = 300  # tokens one logit_bias may name
IGNORED_FIELDS = ("store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "verbosity",
                  "reasoning_effort", "prompt_cache_retention", "prompt_cache_options")
# What this server cannot do, refused by name with why (a 400 naming the field).
REFUSED = {"audio": "audio output is not supported: this server writes text",
           "prediction": "predicted outputs are not supported (the server drafts its own tokens with "
                         "--speculative-method lookup or eagle)",
           "web_search_options": "web search is not available: this server has no tools of its own",
           "moderation": "moderation is not available on this server"}


class LogitBias:
    """OpenAI's `logit_bias` as a logits processor: each named token's logit plus its bias
    (-100 bans a token in practice, +100 all but forces it), before temperature and top-p."""

    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.bias = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        out[self.ids.to(out.device)] += self.bias.to(out.device, out.dtype)
        return out


class ClientFields(BaseModel):
    logit_bias: dict[str, float] | None = None     # token id (a string, as JSON keys are) -> -100..100
    store: bool | None = None                      # IGNORED_FIELDS: accepted, named in the header
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None
    reasoning_effort: str | None = None
    prompt_cache_retention: str | None = None      # prefix caching is automatic here
    prompt_cache_options: dict | None = None
    functions: list | None = None                  # the legacy form of tools: refused by name
    function_call: str | dict | None = None
    modalities: list[str] | None = None            # ["text"] only
    audio: dict | None = None                      # REFUSED: each a 400 that says why
    prediction: dict | None = None
    web_search_options: dict | None = None
    moderation: dict | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_the_default(cls, data):
        """OpenAI's API reads `"n": null`, `"temperature": null` as the default, and clients send them."""
        if isinstance(data, dict):
            fields = cls.model_fields
            data = {k: v for k, v in data.items() if not (v is None and k in fields and fields[k].default is not None)}
        return data

    @field_validator("functions", "function_call")
    @classmethod
    def _legacy_functions(cls, value):
        if value is not None:
            raise ValueError("functions and function_call are the deprecated form of tools: send `tools` and "
                             "`tool_choice` instead")
        return value

    @field_validator(*REFUSED)
    @classmethod
    def _not_here(cls, value, info):
        if value is not None:
            raise ValueError(REFUSED[info.field_name])
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value):
        if value is not None and set(value) - {"text"}:
            raise ValueError(f"this server writes text only, not {sorted(set(value) - {'text'})}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, value):
        if value is None:
            return value
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens, got {len(value)}")
        for key, bias in value.items():
            if not key.isdigit():
                raise ValueError(f"keys are token ids, not {key[:40]!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"a bias lies in [-100, 100], not {bias} (token {key})")
        return value

    def check_vocabulary(self, vocab_size: int) -> None:
        super().check_vocabulary(vocab_size)
        for key in self.logit_bias or {}:
            if int(key) >= vocab_size:
                raise FieldError("logit_bias", f"logit_bias: token {key} is past this model's vocabulary "
                                               f"({vocab_size} tokens)")

    def ignored_fields(self) -> list[str]:
        return super().ignored_fields() + [name for name in IGNORED_FIELDS if getattr(self, name) is not None]

    def sampling_params(self, max_tokens: int):
        params = super().sampling_params(max_tokens)
        if self.logit_bias:
            bias = LogitBias({int(k): v for k, v in self.logit_bias.items()})
            for p in params:
                p.logits_processors.append(bias)
        return params
