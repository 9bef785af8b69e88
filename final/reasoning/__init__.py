"""Reasoning models served: the thinking handed back apart from the answer, a thinking budget,
and structured output that starts where the thinking ends (stage 08's reasoning/).

    --reasoning-parser auto         the default: on when the chat template writes <think>...</think>
    --reasoning-parser qwen3 | deepseek_r1     on (vLLM's names), or a start-up error if neither
                                    the template nor the vocabulary knows the tags
    --reasoning-parser none         off: the thinking stays in `content`

With a parser on, a chat answer's `message.reasoning` (and `reasoning_content`, its older name)
holds the thinking and `message.content` the answer; a stream sends `delta.reasoning` until the
end tag, then `delta.content`. A request may send vLLM's `chat_template_kwargs` (e.g.
`{"enable_thinking": false}`, which Qwen3's template reads) and `thinking_token_budget` (thinking
tokens before the end tag is forced). A constrained request (response_format, or tools with
tool_choice required, named or auto) thinks freely and is held to its grammar from the end tag on.
"""
from __future__ import annotations

from ..protocol import with_fields
from .fields import ReasoningFields
from .thinking import PARSER_CHOICES, Thinking, thinking_for


def add_args(parser) -> None:
    parser.add_argument("--reasoning-parser", default="auto", choices=PARSER_CHOICES,
                        help="split a reasoning model's <think>...</think> into message.reasoning (auto: when the "
                             "chat template writes those tags; none: leave it in content)")


def plug_in_for(name: str = "auto"):
    """The plug-in for the parser `name`: raises ValueError (at start-up) if it does not fit the model."""
    def plug_in(app, server) -> None:
        thinking = thinking_for(name, server.tokenizer, server.grammars)
        if thinking is None:
            return
        server.chat_body = with_fields(server.chat_body, ReasoningFields)
        answer = server.answer_chat

        async def answer_chat(body, ids, max_tokens):
            ids, max_tokens = await server.off_loop(thinking.prepare, body, ids, max_tokens, server.max_len)
            return await answer(body, ids, max_tokens)
        server.answer_chat = answer_chat
    return plug_in


__all__ = ["Thinking", "add_args", "plug_in_for"]
