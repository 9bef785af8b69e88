"""POST /tokenize and POST /detokenize, with vLLM's request and response shapes.

    /tokenize   {"prompt": "...", "add_special_tokens": true, "return_token_strs": false}
             or {"messages": [...], "add_generation_prompt": true}     (the chat template's tokens)
             -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize {"tokens": [ids]} -> {"prompt": "..."}

A harness uses them to count and cut contexts with the server's own tokenizer, and to send
token-id prompts it built itself. Both run on the server's tokenizer thread.
"""
from __future__ import annotations

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from ..errors import error
from ..protocol import Message, find_lone_surrogate


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
    messages: list[Message] = Field(min_length=1)
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

    def tokenize(body: TokenizeCompletion | TokenizeChat) -> list[int]:
        text = body.prompt if isinstance(body, TokenizeCompletion) else tokenizer.apply_chat_template(
            [m.for_template() for m in body.messages], tokenize=False,
            add_generation_prompt=body.add_generation_prompt, continue_final_message=body.continue_final_message)
        return tokenizer(text, add_special_tokens=body.add_special_tokens).input_ids

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeCompletion | TokenizeChat):
        if isinstance(body, TokenizeChat) and body.add_generation_prompt and body.continue_final_message:
            return error(400, "add_generation_prompt and continue_final_message cannot both be true")
        try:
            check_length(len(body.prompt) if isinstance(body, TokenizeCompletion) else
                         sum(len(m.text()) for m in body.messages))
            ids = await off_loop(tokenize, body)
        except (ValueError, TemplateError) as e:  # too long; or the chat template refused these messages
            return error(400, str(e))
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize_route(body: Detokenize):
        if bad := [t for t in body.tokens if not 0 <= t < vocab]:
            return error(400, f"tokens: {bad[0]} is not a token id of this model (0..{vocab - 1})")
        return {"prompt": await off_loop(tokenizer.decode, body.tokens)}
