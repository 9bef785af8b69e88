"""The request fields OpenAI clients send beyond the basics: `logit_bias` implemented, harmless
fields accepted and named back, legacy `functions` refused by name, `null` read as the default,
and every 400 naming the field at fault in `param`."""
import httpx
import openai
import pytest

from course.final.compat import IGNORED_FIELDS, IGNORED_HEADER


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)


def chat(url: str, **fields) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0} | fields
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_logit_bias_bans_the_greedy_choice_and_forces_another(client, byte_tok):
    kw = dict(model="tiny", prompt="abc", max_tokens=6, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    first = byte_tok(plain[0], add_special_tokens=False).input_ids[0]
    banned = client.completions.create(**kw, logit_bias={str(first): -100}).choices[0].text
    assert banned and banned[0] != plain[0]
    forced_id = byte_tok("z", add_special_tokens=False).input_ids[0]
    forced = client.completions.create(**kw, logit_bias={str(forced_id): 100}).choices[0].text
    assert forced == "z" * 6
    # a stream, sampled, n choices: each one takes the bias
    many = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=3,
                                          max_tokens=4, temperature=1.0, seed=1, logit_bias={str(forced_id): 100})
    assert [c.message.content for c in many.choices] == ["zzzz"] * 3


@pytest.mark.parametrize("bias, where", [({"x": 1}, "token ids"), ({"5": 101}, "[-100, 100]"),
                                         ({"99999": 1}, "past this model's vocabulary")])
def test_a_bad_logit_bias_is_a_400_naming_it(server, bias, where):
    r = chat(server[0], logit_bias=bias)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "logit_bias" and where in err["message"]


def test_harmless_fields_are_accepted_and_named_back(server):
    sent = {"store": False, "metadata": {"run": "7"}, "service_tier": "auto", "prompt_cache_key": "k",
            "safety_identifier": "u1", "verbosity": "low", "reasoning_effort": "low", "prompt_cache_retention": "24h",
            "prompt_cache_options": {}}
    assert set(sent) == set(IGNORED_FIELDS)
    plain, with_them = chat(server[0]), chat(server[0], **sent)
    assert with_them.status_code == 200 and IGNORED_HEADER not in plain.headers
    assert with_them.json()["choices"] == plain.json()["choices"]
    assert with_them.headers[IGNORED_HEADER].split(", ") == list(IGNORED_FIELDS)


def test_null_means_the_default(server):
    plain = chat(server[0])
    nulls = chat(server[0], n=None, top_p=None, stream=None, presence_penalty=None, stop=None, seed=None)
    assert nulls.status_code == 200 and nulls.json()["choices"] == plain.json()["choices"]
    sampled = chat(server[0], temperature=None, seed=3)  # null temperature: the default 1.0, sampled
    assert sampled.json()["choices"] == chat(server[0], temperature=1.0, seed=3).json()["choices"]


@pytest.mark.parametrize("field, value", [("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto")])
def test_legacy_functions_are_refused_by_name(server, field, value):
    r = chat(server[0], **{field: value})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == field and "tools" in err["message"]


def test_every_400_names_its_field(server):
    err = chat(server[0], temperature="hot").json()["error"]
    assert err["param"] == "temperature"
    err = chat(server[0], messages=[{"role": "robot", "content": "x"}]).json()["error"]
    assert err["param"].startswith("messages.0")


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SAMPLES = {  # a value of each field of the openai client's chat request, as a client sends it
    "audio": {"voice": "alloy", "format": "wav"}, "frequency_penalty": 0.5, "function_call": "auto",
    "functions": [{"name": "f", "parameters": {}}], "logit_bias": {"65": 5}, "logprobs": True,
    "max_completion_tokens": 4, "max_tokens": 4, "metadata": {"team": "a"}, "modalities": ["text"],
    "model": "tiny", "moderation": {"model": "omni"}, "n": 2, "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.5, "prompt_cache_key": "k",
    "prompt_cache_options": {}, "prompt_cache_retention": "24h", "reasoning_effort": "low",
    "response_format": {"type": "json_object"}, "safety_identifier": "s", "seed": 1, "service_tier": "auto",
    "stop": ["x"], "store": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5,
    "tool_choice": "none", "tools": [TOOL], "top_logprobs": 2, "top_p": 0.9, "user": "u", "verbosity": "low",
    "web_search_options": {}, "messages": [{"role": "user", "content": "hi"}]}
NEEDS = {"stream_options": {"stream": True}, "top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [TOOL]}}


def field_table() -> dict[str, str]:
    """final/compat/README.md's table: field -> its verdict (implemented, accepted, ignored, refused)."""
    from pathlib import Path
    text = (Path(__file__).parents[1] / "README.md").read_text()
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| `")]
    return {cells[1].strip().strip("`"): cells[2].strip().split(":")[0].split(";")[0] for cells in rows}


def test_the_table_names_every_field_of_the_openai_chat_request():
    from openai.types.chat import completion_create_params
    fields = set(completion_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert fields == set(field_table()) == set(SAMPLES)


@pytest.mark.parametrize("field", sorted(SAMPLES))
def test_each_field_of_the_table_is_answered_as_it_says(server, field):
    verdict = field_table()[field]
    r = chat(server[0], **NEEDS.get(field, {}), **{field: SAMPLES[field]})
    if verdict == "refused":
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field, r.text
        return
    assert r.status_code == 200, r.text
    ignored = r.headers.get(IGNORED_HEADER, "").split(", ")
    assert (field in ignored) == (verdict == "ignored"), (field, verdict, ignored)
