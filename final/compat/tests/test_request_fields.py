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
            "safety_identifier": "u1", "verbosity": "low", "reasoning_effort": "low"}
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
