"""A Responses request as the server's chat body, and the Response object around chat's answer.

    input items            chat messages
    message                {"role", "content"} (content parts joined into one text)
    function_call          an assistant turn's `tool_calls` (consecutive calls share the turn)
    function_call_output   {"role": "tool", "tool_call_id", "content"}
    reasoning              left out
    instructions           a system message first (not carried on by previous_response_id)
    tools, tool_choice     chat's nested form {"type": "function", "function": {...}}
    text.format            response_format
    max_output_tokens      max_completion_tokens
    reasoning.effort       reasoning_effort
"""
from __future__ import annotations

from pydantic import ValidationError

from ..errors import FieldError
from .events import Output
from .protocol import ResponsesRequest

# a chat field's name as a Responses client knows it (the rest are the same)
RESPONSES_NAME = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
                  "reasoning_effort": "reasoning"}


def text_of(parts) -> str:
    return "".join(part.text for part in parts)


def conversation(items) -> list[dict]:
    """The input items as chat messages."""
    messages: list[dict] = []
    for item in items:
        if item.type == "message":
            messages.append({"role": item.role, "content": text_of(item.content)})
        elif item.type == "function_call":
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)})
    return messages


def chat_request(body: ResponsesRequest, messages: list[dict]) -> dict:
    """The chat body (a dict, validated by the caller) that asks what `body` asks."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    chat = {"messages": system + messages, "temperature": body.temperature, "top_p": body.top_p,
            "stream": body.stream, "parallel_tool_calls": body.parallel_tool_calls}
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if effort := (body.reasoning or {}).get("effort"):  # a thinking budget where a reasoning parser is on
        chat["reasoning_effort"] = effort
    if body.max_output_tokens is not None:
        chat["max_completion_tokens"] = body.max_output_tokens
    if body.tools:
        chat["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in body.tools]
    choice = body.tool_choice
    if body.tools or choice != "auto":
        chat["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                      "function": {"name": choice.name}}
    form = body.text and body.text.format
    if form and form.type == "json_schema":
        schema = {"name": form.name, "schema": form.schema_, "description": form.description, "strict": form.strict}
        chat["response_format"] = {"type": "json_schema", "json_schema": {k: v for k, v in schema.items()
                                                                          if v is not None}}
    elif form and form.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def field_error(e: ValidationError) -> FieldError:
    """chat's refusal of the translated body, named as the Responses request names its fields."""
    first = e.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    # a field's own error has its place; a rule across fields names it first ("tools: ...")
    where, colon, detail = (str(first["loc"][0]), ":", " " + message) if first["loc"] else message.partition(":")
    name = RESPONSES_NAME.get(where, where) if colon else None
    return FieldError(name, f"{name}:{detail}" if colon else message)


def response_object(body: ResponsesRequest, rid: str, created: int, model: str, output: Output,
                    status: str | None = None) -> dict:
    """The Response object: its output so far, and the request's settings echoed back.
    `status`: in_progress or failed while streaming, else from how the answer ended."""
    status = status or ("incomplete" if output.finish_reason == "length" else "completed")
    usage = output.usage or {}
    inputs, outputs = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model, "output": [item.json() for item in output.items] if status != "in_progress" else [],
        "usage": {"input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}} if output.usage else None,
        "instructions": body.instructions, "metadata": body.metadata,
        "tools": [t.model_dump(exclude_none=True) for t in body.tools],
        "tool_choice": body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.model_dump(),
        "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature, "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens, "previous_response_id": body.previous_response_id,
        "text": body.text.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format
        else {"format": {"type": "text"}},
        "store": body.store, "background": False, "truncation": body.truncation or "disabled",
        "reasoning": body.reasoning, "user": body.user,
    }
