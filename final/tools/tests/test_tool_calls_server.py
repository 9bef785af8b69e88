"""Tool calls through the official openai client against a live tiny server: named and required
calls (one, or several in parallel, n choices) always parse and validate against their
function's schema, for the committed function schemas of the kind agent frameworks send and
for hypothesis-made ones; streamed calls arrive as OpenAI streams them and equal the whole
answer; auto mode answers text; a follow-up turn with a `tool` result and the `developer` role
is answered; each refusal is a 400 naming its field."""
import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.s01_decode_loop.testing import byte_tokenizer
from course.final.testing import CHAT_TEMPLATE, live_server, tiny_engine

TESTDATA = Path(__file__).parent.parent / "testdata"
TOOLS = {p.stem: json.loads(p.read_text()) for p in sorted(TESTDATA.glob("*.json"))}
SCHEMAS = {name: tool["function"].get("parameters", {"type": "object", "properties": {}})
           for name, tool in TOOLS.items()}
ASK = [{"role": "user", "content": "help"}]
# The byte tokenizer spends a token per character, so this template takes the tools (it knows
# them, as Qwen's and Llama 3.1's do) but writes only how many there are.
TOOLS_TEMPLATE = "{% if tools %}({{ tools | length }} tools)\n{% endif %}" + CHAT_TEMPLATE


@pytest.fixture(scope="module")
def server():
    tok = byte_tokenizer()
    engine = tiny_engine(tok, num_blocks=512)  # room for n long answers
    tok.chat_template = TOOLS_TEMPLATE
    with live_server(engine, tok) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def check_calls(message, names=None) -> list:
    """Every call well formed and its arguments valid for its function's schema."""
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name],
                            format_checker=jsonschema.FormatChecker())
    return message.tool_calls


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_named_call_always_validates(client, name):
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=list(TOOLS.values()),
                                         tool_choice=named(name), n=2, temperature=1.0, seed=0, max_tokens=250)
    for choice in out.choices:  # "length": the random model's strings were closed to fit max_tokens
        assert choice.finish_reason in ("tool_calls", "length") and choice.message.content is None
        assert [c.function.name for c in check_calls(choice.message)] == [name]


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_validate_one_or_several(client, parallel):
    counts = []
    for seed in range(2):
        out = client.chat.completions.create(model="tiny", messages=ASK, tools=list(TOOLS.values()), n=2, seed=seed,
                                             tool_choice="required", parallel_tool_calls=parallel, temperature=1.0,
                                             max_tokens=200)
        for choice in out.choices:
            assert choice.finish_reason in ("tool_calls", "length")
            counts.append(len(check_calls(choice.message)))
    assert set(counts) == {1} if not parallel else max(counts) >= 1


def test_streamed_calls_arrive_as_openai_streams_them_and_equal_the_whole(client):
    kwargs = dict(model="tiny", messages=ASK, tools=list(TOOLS.values()), tool_choice="required", temperature=0.0,
                  max_tokens=150)
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        for piece in delta.tool_calls or []:
            if piece.index not in calls:  # a call's first delta: id, type and name
                assert piece.id.startswith("call_") and piece.type == "function" and piece.function.name
                calls[piece.index] = [piece.function.name, piece.function.arguments or ""]
            else:
                assert piece.id is None and piece.function.name is None
                calls[piece.index][1] += piece.function.arguments
    assert finish == whole.finish_reason in ("tool_calls", "length")
    assert [calls[i] for i in sorted(calls)] == [[c.function.name, c.function.arguments]
                                                 for c in whole.message.tool_calls]


def test_a_call_that_fits_max_tokens_is_never_emptied_and_one_that_does_not_says_length(client):
    """The budget counts in tokens: with max_tokens as large as the model's own call takes, the
    call comes back exactly as without a budget, finish_reason "tool_calls"; a token fewer and it
    is closed to fit (valid, shorter) and says "length", so no agent runs it as a whole call."""
    kwargs = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice=named("get_weather"), temperature=0.0)
    free = client.chat.completions.create(max_tokens=400, **kwargs)
    assert free.choices[0].finish_reason == "tool_calls"
    needed = free.usage.completion_tokens
    fits = client.chat.completions.create(max_tokens=needed, **kwargs).choices[0]
    assert fits.finish_reason == "tool_calls"
    assert fits.message.tool_calls[0].function.arguments == free.choices[0].message.tool_calls[0].function.arguments
    for tight in (needed - 1, needed - 25):  # the shortest call fits in about two thirds of it
        cut = client.chat.completions.create(max_tokens=tight, **kwargs).choices[0]
        assert cut.finish_reason == "length", tight
        check_calls(cut.message, {"get_weather"})  # closed to fit: still valid


def test_auto_lets_the_model_answer_in_text(client):
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=list(TOOLS.values()), max_tokens=12,
                                         temperature=1.0, seed=3)
    choice = out.choices[0]
    assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason == "length"


def follow_up(client) -> list[dict]:
    """A conversation an agent sends back: the developer role, a call the model made, its result."""
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOLS["get_weather"]], max_tokens=100,
                                           tool_choice="required", temperature=0.0).choices[0].message
    call = first.tool_calls[0]
    return [{"role": "developer", "content": "Be brief."}, *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": '{"temp_c": 21}'}]


def test_a_follow_up_turn_with_a_tool_result_and_the_developer_role_is_answered(client):
    messages = follow_up(client)
    out = client.chat.completions.create(model="tiny", messages=messages, tools=[TOOLS["get_weather"]], max_tokens=8,
                                         tool_choice="none", temperature=0.0)
    assert out.choices[0].message.content and out.choices[0].message.tool_calls is None


def test_tokenize_counts_the_prompt_the_chat_route_renders(client, server):
    """/tokenize with `messages` and `tools` renders what the chat route renders (the assistant's
    tool calls, the `tool` results, the tools): its count is the chat answer's prompt_tokens."""
    turns = follow_up(client)
    for messages, tools in [(ASK, None), (ASK, list(TOOLS.values())), (turns, [TOOLS["get_weather"]]), (turns, None)]:
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                             **({"tools": tools, "tool_choice": "none"} if tools else {}))
        counted = httpx.post(server + "/tokenize", json={"messages": messages} | ({"tools": tools} if tools else {}))
        assert counted.json()["count"] == out.usage.prompt_tokens
    bad = httpx.post(server + "/tokenize", json={"messages": [{"role": "tool", "content": 3}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("messages")


def test_best_effort_relaxations_are_reported_with_the_function_named(server):
    tool = {"type": "function", "function": {"name": "dedupe", "parameters": {
        "type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True,
                                                 "maxItems": 3}}, "required": ["ids"]}}}
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "messages": ASK, "tools": [tool], "tool_choice": "required", "max_tokens": 120, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("tool_calls", "length")
    assert "tools[dedupe]" in r.headers["x-structured-output-warnings"]


WEATHER = TOOLS["get_weather"]


@pytest.mark.parametrize("change,field", [
    ({"tool_choice": named("no_such_function")}, "tool_choice"),
    ({"tool_choice": "required", "tools": None}, "tool_choice"),
    ({"tools": [WEATHER] * 2}, "tools"),
    ({"tools": [WEATHER] * 129}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "u", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "uniqueItems"),
    ({"tools": [{"type": "function", "function": {"name": "d", "parameters": json.loads(
        '{"type": "object", "properties": {"x": ' * 80 + '{}' + '}}' * 80)}}], "tool_choice": "required"}, "max_depth"),
    ({"messages": [*ASK, {"role": "tool", "content": "42"}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "tool_calls"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
])
def test_refusals_are_400s_naming_the_field(server, change, field):
    body = {"messages": ASK, "tools": [WEATHER], "max_tokens": 4} | change
    r = httpx.post(server + "/v1/chat/completions", json={k: v for k, v in body.items() if v is not None}, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


def test_n_above_one_with_required_is_served(client):
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", n=4,
                                         max_tokens=100, temperature=1.0, seed=5)
    assert len(out.choices) == 4 and all(check_calls(c.message) for c in out.choices)


LEAVES = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-1000, 1000), st.integers(0, 500)),
    st.lists(st.text("abcxyz_", min_size=1, max_size=6), min_size=1, max_size=4, unique=True).map(
        lambda v: {"type": "string", "enum": v}),
    st.just({"type": "boolean"}), st.just({"type": "number"}), st.just({"type": "string", "maxLength": 8}))
PARAMETER_SCHEMAS = st.recursive(LEAVES, lambda inner: st.one_of(
    st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, inner, st.integers(0, 3)),
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req}))),
    max_leaves=6).map(lambda s: s if s.get("type") == "object" else {"type": "object", "properties": {"value": s},
                                                                      "required": ["value"]})


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=PARAMETER_SCHEMAS, seed=st.integers(0, 2**16))
def test_hypothesis_made_schemas_give_valid_arguments(client, schema, seed):
    tool = {"type": "function", "function": {"name": "made", "parameters": schema}}
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[tool], tool_choice=named("made"),
                                         temperature=1.0, seed=seed, max_tokens=250)
    assert out.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(out.choices[0].message.tool_calls[0].function.arguments), schema)
