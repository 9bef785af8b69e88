"""POST /v1/responses through the official openai client against a live tiny server: the prompt
is exactly the chat prompt the items make (counted in the byte tokenizer's tokens), structured
text and function calls validate, `previous_response_id` continues a conversation, stored
responses are read and deleted, and every refusal is a 4xx naming its field."""
import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response

from course.final.structured import WARNINGS_HEADER

from .conftest import STORE_SIZE

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


def prompt_tokens(tok, messages: list[dict], tools=None) -> int:
    """What the chat route would count for these messages."""
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return len(tok(rendered, add_special_tokens=False).input_ids)


def post(server, **body) -> httpx.Response:
    return httpx.post(server[0] + "/v1/responses", json=body, timeout=60)


def test_a_string_input_is_one_user_message_and_the_response_parses(client, server, tok):
    out = client.responses.create(model="tiny", input="hi", max_output_tokens=5, temperature=0, metadata={"run": "7"})
    assert out.id.startswith("resp_") and out.object == "response" and out.model == "tiny"
    assert out.usage.input_tokens == prompt_tokens(tok, [{"role": "user", "content": "hi"}])
    assert out.usage.output_tokens == 5 and out.usage.total_tokens == out.usage.input_tokens + 5
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    [message] = out.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "incomplete"
    assert out.output_text == message.content[0].text and out.metadata == {"run": "7"}
    raw = post(server, input="hi", max_output_tokens=5, temperature=0).json()
    Response.model_validate(raw)  # strict: every field the client's model requires, with its type
    assert "output_text" not in raw and raw["output"][0]["content"][0]["text"] == out.output_text  # greedy


def test_items_and_instructions_make_the_chat_prompt(client, tok):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
             {"role": "user", "content": "And Tokyo?"}]
    out = client.responses.create(model="tiny", input=items, instructions="You are a weather bot.",
                                  max_output_tokens=3)
    expected = [{"role": "system", "content": "You are a weather bot."}, {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Paris?"}, {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "And Tokyo?"}]  # the reasoning item is left out
    assert out.usage.input_tokens == prompt_tokens(tok, expected)
    assert out.instructions == "You are a weather bot."


def test_a_json_schema_text_format_gives_valid_json(client, server):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    for seed_text in ("Who?", "Name someone."):
        out = client.responses.create(model="tiny", input=seed_text, text={"format": fmt}, max_output_tokens=60)
        jsonschema.validate(json.loads(out.output_text), PERSON)
        assert out.text.format.type == "json_schema"
    # best-effort: what the grammar did not enforce is reported as on the chat route
    loose = {"type": "json_schema", "name": "note",
             "schema": {"type": "object", "properties": {"s": {"type": "string"}}}}
    r = post(server, input="Note?", text={"format": loose}, max_output_tokens=80)
    assert r.status_code == 200 and "default-bound" in r.headers[WARNINGS_HEADER]


def test_a_required_function_tool_gives_a_valid_call_and_its_result_continues(client, tok):
    out = client.responses.create(model="tiny", input="Weather in Paris?", tools=[TOOL], tool_choice="required",
                                  parallel_tool_calls=False, max_output_tokens=200)
    calls = [item for item in out.output if item.type == "function_call"]
    assert len(calls) == 1 and out.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert out.tools[0].name == "get_weather" and out.tool_choice == "required"
    # the agent runs the tool and sends its result back, continuing the stored conversation
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    follow = client.responses.create(model="tiny", input=[result], previous_response_id=out.id, max_output_tokens=3,
                                     tools=[TOOL], tool_choice="none")
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": json.loads(call.arguments)}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "21 C, sunny"}]
    assert follow.usage.input_tokens == prompt_tokens(tok, chat, tools=[TOOL])
    assert follow.previous_response_id == out.id


def test_previous_response_id_continues_the_conversation(client, tok):
    first = client.responses.create(model="tiny", input="hi", instructions="Be terse.", max_output_tokens=4,
                                    temperature=0)
    second = client.responses.create(model="tiny", input="more", previous_response_id=first.id, max_output_tokens=4,
                                     temperature=0)
    # the first turn and its answer, not its instructions (OpenAI does not carry them on)
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "more"}]
    assert second.usage.input_tokens == prompt_tokens(tok, turns) > first.usage.input_tokens
    third = client.responses.create(model="tiny", input="again", previous_response_id=second.id, max_output_tokens=2)
    turns += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "again"}]
    assert third.usage.input_tokens == prompt_tokens(tok, turns)


def test_stored_responses_are_read_and_deleted(client):
    out = client.responses.create(model="tiny", input="hi", max_output_tokens=3)
    assert client.responses.retrieve(out.id).model_dump() == out.model_dump()
    gone = httpx.delete(str(client.base_url) + f"responses/{out.id}").json()
    assert gone == {"id": out.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(out.id)
    assert missing.value.body["param"] == "response_id"
    unstored = client.responses.create(model="tiny", input="hi", max_output_tokens=3, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="tiny", input="x", previous_response_id=unstored.id)
    assert missing.value.body["param"] == "previous_response_id" and "store: false" in missing.value.message


def test_the_store_keeps_the_most_recent_and_says_so_of_an_evicted_id(client):
    ids = [client.responses.create(model="tiny", input="hi", max_output_tokens=1).id for _ in range(STORE_SIZE + 1)]
    assert client.responses.retrieve(ids[-1]).id == ids[-1]
    with pytest.raises(openai.NotFoundError) as evicted:
        client.responses.create(model="tiny", input="x", previous_response_id=ids[0])
    assert "evicted" in evicted.value.message and f"only the {STORE_SIZE} most recent" in evicted.value.message
    assert evicted.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.retrieve("resp_never")
    assert "evicted" not in unknown.value.message


@pytest.mark.parametrize("body, param, words", [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.message.content.0",
     "input_image"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.function_call.call_id",
     "required"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input.0.message.role", "role"),
    ({"input": []}, "input", "at least 1"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"input": "x", "tools": [TOOL, TOOL]}, "tools", "share a name"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "schema"),
    ({"input": "x", "tools": [TOOL], "text": {"format": {"type": "json_object"}}}, "text.format", "tools"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater than"),
    ({"input": "x", "background": True}, "background", "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "x", "frobnicate": 1}, "frobnicate", "Extra inputs"),
    ({"input": "x", "instructions": "word " * 200_000}, None, "maximum context length"),
])
def test_each_refusal_is_a_400_naming_its_field(server, body, param, words):
    r = post(server, **body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and words in err["message"], err


def test_harmless_fields_are_accepted_and_named_back(server):
    sent = {"include": [], "truncation": "disabled", "user": "u1", "prompt_cache_key": "k", "service_tier": "auto",
            "reasoning": {"effort": "low", "summary": "auto"}, "safety_identifier": "s", "background": False}
    r = post(server, input="hi", max_output_tokens=2, **sent)
    assert r.status_code == 200 and r.json()["user"] == "u1"
    named = r.headers["x-ignored-fields"].split(", ")
    assert set(named) == set(sent) - {"background"}  # background false is what this server does
    assert "x-ignored-fields" not in post(server, input="hi", max_output_tokens=2).headers
