"""Hostile /v1/responses bodies for the fuzzer's table (stress/fuzz.py): unsupported items and
tools, unknown ids, giant instructions, invalid text. Each must get a 4xx naming the problem, or
a whole answer (a stream ends with response.completed or .incomplete); never a 5xx, never a hang."""
from __future__ import annotations

import json

RESPONSES = "/v1/responses"
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"enum": [1, 2]}}}}

RESPONSES_CASES: list[tuple[str, str, object]] = [
    ("responses: item_reference item", RESPONSES, {"input": [{"type": "item_reference", "id": "msg_1"}]}),
    ("responses: image part", RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x"}]}]}),
    ("responses: function_call without call_id", RESPONSES, {"input": [{"type": "function_call", "name": "f",
                                                                        "arguments": "{}"}]}),
    ("responses: function_call_output a number", RESPONSES, {"input": [{"type": "function_call_output",
                                                                        "call_id": "c", "output": 5}]}),
    ("responses: item a string", RESPONSES, {"input": ["hi"]}),
    ("responses: no items", RESPONSES, {"input": []}),
    ("responses: input null", RESPONSES, {"input": None}),
    ("responses: 20000 items", RESPONSES, {"input": [{"role": "user", "content": "hi"}] * 20_000,
                                           "max_output_tokens": 2}),
    ("responses: unknown previous_response_id", RESPONSES, {"input": "x", "previous_response_id": "resp_nope"}),
    ("responses: previous_response_id a list", RESPONSES, {"input": "x", "previous_response_id": ["resp_1"]}),
    ("responses: instructions 1 MB", RESPONSES, {"input": "x", "instructions": "word " * 200_000}),
    ("responses: surrogate in metadata", RESPONSES, '{"input": "x", "metadata": {"k": "\\ud800"}}'),
    ("responses: surrogate in a part", RESPONSES, '{"input": [{"role": "user", "content": [{"type": "input_text", '
                                                  '"text": "\\udc00"}]}]}'),
    ("responses: web_search tool", RESPONSES, {"input": "x", "tools": [{"type": "web_search"}]}),
    ("responses: chat-style tool", RESPONSES, {"input": "x", "tools": [{"type": "function",
                                                                        "function": {"name": "f"}}]}),
    ("responses: tool_choice unknown function", RESPONSES, {"input": "x", "tools": [TOOL],
                                                            "tool_choice": {"type": "function", "name": "g"}}),
    ("responses: tool_choice allowed_tools", RESPONSES, {"input": "x", "tools": [TOOL], "tool_choice": {
        "type": "allowed_tools", "mode": "auto", "tools": []}}),
    ("responses: background true", RESPONSES, {"input": "x", "background": True}),
    ("responses: conversation", RESPONSES, {"input": "x", "conversation": "conv_1"}),
    ("responses: unknown field", RESPONSES, {"input": "x", "messages": []}),
    ("responses: text format a string", RESPONSES, {"input": "x", "text": {"format": "json"}}),
    ("responses: json_schema without schema", RESPONSES, {"input": "x", "text": {"format": {"type": "json_schema",
                                                                                           "name": "s"}}}),
    ("responses: json_schema 400 deep", RESPONSES, {"input": "x", "text": {"format": {
        "type": "json_schema", "name": "s", "schema": json.loads('{"type": "array", "items": ' * 400 + "{}"
                                                                 + "}" * 400)}}}),
    ("responses: max_output_tokens past context", RESPONSES, {"input": "x", "max_output_tokens": 10**6}),
    ("responses: streamed required call", RESPONSES, {"input": "hi", "tools": [TOOL], "tool_choice": "required",
                                                      "stream": True, "max_output_tokens": 40}),
    ("responses: streamed, max_output_tokens 1", RESPONSES, {"input": "hi", "stream": True, "max_output_tokens": 1,
                                                             "text": {"format": {"type": "json_object"}}}),
]


def stream_problem(events: list[str]) -> tuple[int, str | None]:
    """(status, what is wrong or None) of a streamed response's `data:` lines: it must end as a
    response ends; a failed one counts as the 5xx it stands for."""
    last = json.loads(events[-1]) if events else {}
    if last.get("type") == "response.failed":
        return 500, f"response.failed: {events[-1][:300]}"
    if last.get("type") not in ("response.completed", "response.incomplete"):
        return 200, "a Responses stream that does not end with response.completed or response.incomplete"
    return 200, None
