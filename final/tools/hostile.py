"""Hostile tool-call bodies for the fuzzer's table (stress/fuzz.py): thousands of tools, deep and
huge parameter schemas, tool messages without ids, unknown or malformed tool choices. Each must
get a 400 naming the field, or a whole answer; never a 5xx, never a hang."""
from __future__ import annotations

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def tool(name: str = "f", parameters=None, **extra) -> dict:
    function = {"name": name} | ({"parameters": parameters} if parameters is not None else {}) | extra
    return {"type": "function", "function": function}


def deep_object(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string", "enum": [f"v{j}" for j in range(5)]}
                                          for i in range(60)}}

TOOL_CASES: list[tuple[str, str, object]] = [
    ("tools 5000", CHAT, {"messages": USER, "tools": [tool(f"f{i}") for i in range(5000)]}),
    ("tools 128 wide schemas", CHAT, {"messages": USER, "tool_choice": "required", "max_tokens": 4,
                                      "tools": [tool(f"f{i}", WIDE) for i in range(128)]}),
    ("tool schema 400 deep", CHAT, {"messages": USER, "tool_choice": "required",
                                    "tools": [tool("d", deep_object(400))]}),
    ("tool schema 400 deep, auto", CHAT, {"messages": USER, "tools": [tool("d", deep_object(400))], "max_tokens": 2}),
    ("tool schema $ref loop", CHAT, {"messages": USER, "tool_choice": "required", "tools": [tool("r", {
        "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})]}),
    ("tool schema maxLength 1e20", CHAT, {"messages": USER, "tool_choice": "required", "tools": [tool("m", {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 10**20}}})]}),
    ("tool parameters a list", CHAT, {"messages": USER, "tools": [tool("p", [1, 2])]}),
    ("tool name 10k chars", CHAT, {"messages": USER, "tools": [tool("n" * 10_000)]}),
    ("tool name with quotes", CHAT, {"messages": USER, "tools": [tool('a"b')]}),
    ("tool type not function", CHAT, {"messages": USER, "tools": [{"type": "retrieval"}]}),
    ("tools duplicate names", CHAT, {"messages": USER, "tools": [tool("f"), tool("f")]}),
    ("tool_choice unknown function", CHAT, {"messages": USER, "tools": [tool()],
                                            "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    ("tool_choice a number", CHAT, {"messages": USER, "tools": [tool()], "tool_choice": 5}),
    ("tool_choice required, no tools", CHAT, {"messages": USER, "tool_choice": "required"}),
    ("tool message without id", CHAT, {"messages": USER + [{"role": "tool", "content": "42"}]}),
    ("tool message id not a string", CHAT, {"messages": USER + [{"role": "tool", "content": "4",
                                                                 "tool_call_id": [1]}]}),
    ("tool_calls on a user message", CHAT, {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
    ("assistant call arguments not JSON", CHAT, {"max_tokens": 2, "messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "f", "arguments": "{{{not json"}}]}, {"role": "tool", "tool_call_id": "c", "content": "ok"}]}),
    ("required, n 4, streamed", CHAT, {"messages": USER, "tools": [tool()], "tool_choice": "required", "n": 4,
                                       "stream": True, "max_tokens": 40}),
    ("required with response_format", CHAT, {"messages": USER, "tools": [tool()], "tool_choice": "required",
                                             "response_format": {"type": "json_object"}}),
    ("developer role, content parts", CHAT, {"max_tokens": 2, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]}] + USER}),
]
