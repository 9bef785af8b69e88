"""POST /tokenize and POST /detokenize, with vLLM's request and response shapes.

    /tokenize   {"prompt": "...", "add_special_tokens": true, "return_token_strs": false}
             or {"messages": [...], "tools": [...], "add_generation_prompt": true}
                (the chat route's own prompt: its messages, tool calls and tools, rendered alike)
             -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize {"tokens": [ids]} -> {"prompt": "..."}

A harness uses them to count and cut contexts with the server's own tokenizer, and to send
token-id prompts it built itself. Both run on the server's tokenizer thread.
"""
from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from ..errors import error
from ..protocol import find_lone_surrogate


class TokenizerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data):  # as protocol.py's bodies: no tokenizer can take a lone surrogate
        if (path := find_lone_surrogate(data)) is not None:
            raise ValueError(f"{path.removeprefix('body.')} holds a lone UTF-16 surrogate; send UTF-8")
        return data


class TokenizeCompletion(TokenizerBody):
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(TokenizerBody):
    messages: list[dict] = Field(min_length=1)  # read as the chat route reads them (its body, plug-ins' fields too)
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool = False


class Detokenize(TokenizerBody):
    tokens: list[StrictInt]


def add_token_routes(app, server) -> None:
    """The two routes on `app`, with the tokenizer, limits and text thread of `server` (server.py's Server)."""
    tokenizer, off_loop, check_length = server.tokenizer, server.off_loop, server.check_length
    max_len, vocab = server.engine.limits.max_model_len, server.engine.limits.vocab_size

    def chat_prompt(body: TokenizeChat) -> tuple[list[dict], list[dict] | None]:
        """The messages and tools as the chat route renders them (tools/ gives tool calls and the
        `tool` role their template form); a body the chat route would refuse is refused alike."""
        try:
            fields = {"messages": body.messages} | ({"tools": body.tools} if body.tools else {})
            chat = server.chat_body.model_validate(fields)
        except ValidationError as e:
            raise RequestValidationError([{**x, "loc": ("body", *x["loc"])} for x in e.errors()]) from None
        return chat.chat_prompt(tokenizer)

    def tokenize(body: TokenizeCompletion | TokenizeChat, chat: tuple | None) -> list[int]:
        text = body.prompt if chat is None else tokenizer.apply_chat_template(
            chat[0], tools=chat[1], tokenize=False, add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message)
        return tokenizer(text, add_special_tokens=body.add_special_tokens).input_ids

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeCompletion | TokenizeChat):
        if isinstance(body, TokenizeChat) and body.add_generation_prompt and body.continue_final_message:
            return error(400, "add_generation_prompt and continue_final_message cannot both be true")
        chat = chat_prompt(body) if isinstance(body, TokenizeChat) else None
        try:
            check_length(len(body.prompt) if chat is None else
                         sum(len(m["content"]) for m in chat[0]) + len(str(chat[1] or "")))
            ids = await off_loop(tokenize, body, chat)
        except (ValueError, TemplateError) as e:  # too long; or the chat template refused these messages
            return error(400, str(e))
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize_route(body: Detokenize):
        if bad := [t for t in body.tokens if not 0 <= t < vocab]:
            return error(400, f"tokens: {bad[0]} is not a token id of this model (0..{vocab - 1})")
        return {"prompt": await off_loop(tokenizer.decode, body.tokens)}
