"""The translation alone, fed chat-shaped answers and stream chunks (reasoning included, as a
reasoning parser writes them): the items, the events in order and valid for the openai client's
own types, a failure mid-stream, chat's stream closed however the stream ends; and the request
side: items into chat messages, tools and formats into chat's fields."""
import asyncio
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter, ValidationError, model_validator

from course.final.responses_api.events import Output, stream_events
from course.final.responses_api.protocol import ResponsesRequest
from course.final.responses_api.translate import chat_request, conversation, field_error, response_object

EVENT = TypeAdapter(ResponseStreamEvent)
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
USAGE = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}


def whole(message: dict, finish: str = "stop") -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant"} | message, "finish_reason": finish}],
            "usage": USAGE}


def respond(output: Output, status=None, **fields) -> dict:
    body = ResponsesRequest(input="hi", **fields)
    return response_object(body, "resp_1", 0, "tiny", output, status)


def test_a_whole_answer_with_reasoning_text_and_a_call_becomes_three_items():
    output = Output()
    output.whole(whole({"reasoning": "Paris, so call.", "content": "Checking.", "tool_calls": [CALL]}, "tool_calls"))
    response = Response.model_validate(respond(output))
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = response.output
    assert reasoning.id.startswith("rs_") and reasoning.content[0].text == "Paris, so call." and reasoning.summary == []
    assert message.content[0].text == "Checking." and message.status == "completed"
    assert (call.call_id, call.name, call.arguments, call.status) == ("call_1", "get_weather", '{"city": "Paris"}',
                                                                      "completed")
    assert response.usage.input_tokens == 7 and response.usage.output_tokens == 9 and response.status == "completed"
    # a follow-up's prompt: the answer as one assistant turn, its reasoning left out
    assert output.chat_message() == {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}


@pytest.mark.parametrize("message", [{"content": "", "reasoning": None}, {"content": "", "reasoning": ""}])
def test_an_empty_answer_is_one_empty_message_and_no_reasoning_item(message):
    output = Output()
    output.whole(whole(message, "length"))
    response = Response.model_validate(respond(output))
    assert [(i.type, i.content[0].text, i.status) for i in response.output] == [("message", "", "incomplete")]
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


class FakeChatStream:
    """What server.chat returns for a stream: SSE chunks, and a background task that closes it."""

    def __init__(self, chunks: list[dict]):
        self.chunks, self.closed, self.aclosed = chunks, False, False
        self.body_iterator = self._iterate()
        self.background = self._close

    async def _iterate(self):
        try:
            for chunk in self.chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.aclosed = True

    async def _close(self):
        self.closed = True


def delta(finish=None, **fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def events_of(chat: FakeChatStream, stop_after: int | None = None) -> tuple[list[dict], list[dict]]:
    """(events, responses handed to on_end) of the translated stream, read to its end or for
    `stop_after` events, as a client that hangs up."""
    output, ended = Output(), []

    def on_end():
        ended.append(respond(output, stream=True))
        return ended[-1]

    async def read():
        seen, stream = [], stream_events(chat, output, lambda status: respond(output, status, stream=True), on_end)
        async for text in stream:
            kind, data = text.split("\n", 2)[:2]
            seen.append(json.loads(data.removeprefix("data: ")))
            assert kind == f"event: {seen[-1]['type']}"
            if len(seen) == stop_after:
                break
        await stream.aclose()
        return seen
    return asyncio.run(read()), ended


def test_streamed_reasoning_then_text_follow_the_documented_sequence():
    chat = FakeChatStream([delta(role="assistant", reasoning="Think"), delta(reasoning="ing."),
                           delta(content="Sun"), delta(content="ny.", finish="stop"),
                           {"choices": [], "usage": USAGE}])
    events, ended = events_of(chat)
    for event in events:
        EVENT.validate_python(event)  # each one valid for the openai client's own types
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["output_index"] for e in events if "delta" in e] == [0, 0, 1, 1]
    final = events[-1]["response"]
    assert final == ended[0] and final["output"][0]["content"][0]["text"] == "Thinking."
    assert final["output"][1]["content"][0]["text"] == "Sunny." and final["usage"]["output_tokens"] == 9
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert chat.aclosed and chat.closed


def test_streamed_calls_open_one_item_each():
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    second = {"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": ""}}
    piece = lambda i, text: {"index": i, "function": {"arguments": text}}  # noqa: E731
    chat = FakeChatStream([delta(tool_calls=[first]), delta(tool_calls=[piece(0, '{"a": '), piece(0, "1}")]),
                           delta(tool_calls=[second]), delta(tool_calls=[piece(1, "{}")], finish="tool_calls")])
    events, _ = events_of(chat)
    for event in events:
        EVENT.validate_python(event)
    items = events[-1]["response"]["output"]
    assert [(i["name"], i["arguments"], i["call_id"]) for i in items] == [("f", '{"a": 1}', "call_1"),
                                                                           ("g", "{}", "call_2")]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == ['{"a": 1}', "{}"]


def test_a_failure_mid_stream_is_a_failed_response_and_nothing_is_stored():
    chat = FakeChatStream([delta(content="Hal"), {"error": {"message": "engine failed", "code": 500}}])
    events, ended = events_of(chat)
    assert events[-1]["type"] == "response.failed" and ended == []
    failed = EVENT.validate_python(events[-1]).response
    assert failed.status == "failed" and failed.error.message == "engine failed" and failed.error.code == "server_error"
    assert chat.closed


def test_a_client_that_hangs_up_closes_chats_stream():
    chat = FakeChatStream([delta(content="a"), delta(content="b"), delta(content="c", finish="stop")])
    events, ended = events_of(chat, stop_after=5)
    assert len(events) == 5 and ended == [] and chat.aclosed and chat.closed


def test_items_become_chat_messages():
    body = ResponsesRequest(input=[
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}])
    assert conversation(body.input) == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"}]


def test_the_request_becomes_chats_fields():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    body = ResponsesRequest(input="hi", instructions="Be brief.", tools=[tool], tool_choice={"type": "function",
                            "name": "f"}, max_output_tokens=9, temperature=0.5, stream=True,
                            text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}})
    chat = chat_request(body, conversation(body.input))
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                               "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "p", "schema": {"type": "object"}}}
    assert (chat["max_completion_tokens"], chat["temperature"], chat["stream_options"]) == (9, 0.5,
                                                                                           {"include_usage": True})
    plain = chat_request(ResponsesRequest(input="hi", text={"format": {"type": "text"}}), [])
    assert not {"tools", "tool_choice", "response_format", "max_completion_tokens"} & set(plain)


class Chat(BaseModel):
    """A stand-in for the server's chat body: a field, and a rule across fields."""
    messages: list[int]
    max_completion_tokens: int = 1

    @model_validator(mode="after")
    def _rule(self):
        if self.max_completion_tokens > 1:
            raise ValueError("response_format: cannot be combined with tools" if self.max_completion_tokens == 2
                             else "a rule that names no field")
        return self


@pytest.mark.parametrize("data, param, message", [
    ({"messages": "x"}, "input", "input: Input should be a valid list"),
    ({"messages": [], "max_completion_tokens": "x"}, "max_output_tokens", "max_output_tokens: Input should be"),
    ({"messages": [], "max_completion_tokens": 2}, "text.format", "text.format: cannot be combined with tools"),
    ({"messages": [], "max_completion_tokens": 3}, None, "a rule that names no field")])
def test_chats_refusals_are_named_in_responses_terms(data, param, message):
    with pytest.raises(ValidationError) as refused:
        Chat.model_validate(data)
    error = field_error(refused.value)
    assert error.param == param and str(error).startswith(message)
