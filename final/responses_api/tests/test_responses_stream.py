"""Streamed responses through the openai client's `responses.stream`: the documented event
sequence, numbered in order; the deltas make the final output, which equals the whole answer;
and a client that hangs up frees its request."""
import json
import time

import httpx
import jsonschema

from course.final.testing import metric

from .test_responses_server import PERSON, TOOL, WEATHER

TEXT_OPEN = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
TEXT_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def run_length_types(events) -> list[str]:
    """The event types with each run of deltas written once."""
    types = [e.type for e in events]
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


def test_a_streamed_text_answer_follows_the_documented_sequence(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON}  # a grammar that ends: "completed"
    kw = dict(model="tiny", input="Who?", text={"format": fmt}, max_output_tokens=60, temperature=0)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert run_length_types(events) == TEXT_OPEN + ["response.output_text.delta"] + TEXT_CLOSE + ["response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == events[-4].text  # output_text.done carries the whole text
    jsonschema.validate(json.loads(deltas), PERSON)
    whole = client.responses.create(**kw)
    assert whole.output_text == deltas and whole.usage.output_tokens == final.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == deltas  # stored, as a whole answer is


def test_a_stream_cut_by_max_output_tokens_ends_incomplete(client):
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=6, temperature=0) as stream:
        events = list(stream)
    assert run_length_types(events) == TEXT_OPEN + ["response.output_text.delta"] + TEXT_CLOSE + ["response.incomplete"]
    last = events[-1].response
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.output[0].status == "incomplete" and last.usage.output_tokens == 6


def test_a_streamed_function_call_follows_the_documented_sequence(client):
    with client.responses.stream(model="tiny", input="Weather?", tools=[TOOL], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=200) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert run_length_types(events) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    [call] = final.output
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments == events[-3].arguments and events[2].item.call_id == call.call_id
    jsonschema.validate(json.loads(deltas), WEATHER)


def test_a_client_that_hangs_up_frees_its_request(server):
    url, engine = server
    body = {"input": "go", "max_output_tokens": 300, "stream": True, "temperature": 0}
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 12:
                break  # hang up mid-answer
    for _ in range(200):  # polled until the engine has seen the disconnect, at most 10 s
        if not engine.call(lambda e: e.has_unfinished()):
            break
        time.sleep(0.05)
    assert engine.call(lambda e: (e.has_unfinished(), e.requests)) == (False, {})
    assert metric(url, "vllm:request_success_total", finished_reason="abort") >= 1
