"""The body field `speculative` through the server, with the official openai client, on a live
tiny server that speculates by prompt lookup: the same greedy answers with speculation on and
off (both routes, streamed and not), drafts only for requests that leave it on, seeded sampling
reproducible with drafts, and a 400 for anything but a boolean."""
import httpx
import openai
import pytest

from course.final.engine import SpeculativeConfig
from course.final.testing import live_server, metric, tiny_engine

# repetitive prompts, so prompt lookup finds n-grams to draft from, and one that is not
PROMPTS = ["abcabcabcabcabc", "the cat sat on the mat, the cat sat", "0101010101010101", "Hello"]
CASES = [(route, prompt, stream) for route in ("completions", "chat") for prompt in PROMPTS for stream in (False, True)]
SPEC = ("drafts", "draft_tokens", "accepted_tokens")


@pytest.fixture(scope="module")
def lookup_server(byte_tok):
    """(base URL, AsyncEngine) of a live tiny server started with --speculative-method lookup, k=3."""
    engine = tiny_engine(byte_tok, speculative=SpeculativeConfig("lookup", 3), max_waiting=8)
    with live_server(engine, byte_tok) as url:
        yield url, engine


@pytest.fixture
def client(lookup_server):
    return openai.OpenAI(base_url=lookup_server[0] + "/v1", api_key="none", max_retries=0)


def spec_counters(url, engine) -> dict[str, float]:
    """The spec decode counters, once the engine thread has published its last step: it updates
    the metrics after each step and runs a `call` only at the start of the next loop turn."""
    engine.call(lambda e: None)
    return {key: metric(url, f"vllm:spec_decode_num_{key}_total") for key in SPEC}


def answer(client, route, prompt, stream, speculative: bool | None) -> str:
    """The text of one greedy request; speculative=None leaves the field out (its default: on)."""
    extra = {"ignore_eos": True} | ({} if speculative is None else {"speculative": speculative})
    kw = dict(model="tiny", max_tokens=16, temperature=0, extra_body=extra)
    if route == "completions":
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **kw)
                           if c.choices)
        return client.completions.create(prompt=prompt, **kw).choices[0].text
    messages = [{"role": "user", "content": prompt}]
    if stream:
        return "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(messages=messages, stream=True, **kw) if c.choices)
    return client.chat.completions.create(messages=messages, **kw).choices[0].message.content


def test_server_answers_the_same_with_speculation_switched_off(lookup_server, client):
    url, engine = lookup_server
    start = spec_counters(url, engine)
    off = [answer(client, *case, speculative=False) for case in CASES]
    assert spec_counters(url, engine) == start  # not one request drafted for
    on = [answer(client, *case, speculative=None) for case in CASES]
    assert on == off
    assert all(off)  # the comparison is not between empty answers
    counters = spec_counters(url, engine)
    assert counters["drafts"] > start["drafts"] and counters["accepted_tokens"] > start["accepted_tokens"]
    explicit = [answer(client, *case, speculative=True) for case in CASES[:2]]
    assert explicit == on[:2] and spec_counters(url, engine)["drafts"] > counters["drafts"]


def test_server_spec_metrics_agree_with_the_engine_counts(lookup_server, client):
    url, engine = lookup_server
    answer(client, "completions", PROMPTS[0], False, speculative=None)
    counters = spec_counters(url, engine)
    stats = engine.call(lambda e: e.spec_stats)
    assert counters == {"drafts": stats.target_forwards, "draft_tokens": stats.proposed,
                        "accepted_tokens": stats.accepted}
    assert counters["drafts"] > 0


def test_server_seeded_sampling_with_speculation_reproduces(lookup_server, client):
    url, engine = lookup_server
    before = spec_counters(url, engine)["drafts"]
    for route in ("completions", "chat"):
        kw = dict(model="tiny", max_tokens=16, temperature=0.8, seed=7, extra_body={"ignore_eos": True})
        if route == "completions":
            texts = [client.completions.create(prompt=PROMPTS[0], **kw).choices[0].text for _ in range(2)]
        else:
            messages = [{"role": "user", "content": PROMPTS[2]}]
            texts = [client.chat.completions.create(messages=messages, **kw).choices[0].message.content
                     for _ in range(2)]
        assert texts[0] == texts[1] and texts[0]
    assert spec_counters(url, engine)["drafts"] > before  # rejection sampling did run


@pytest.mark.parametrize("route, body, value", [  # a string is not guessed at, nor a number read as a boolean
    ("/v1/completions", {"prompt": "x"}, "false"), ("/v1/completions", {"prompt": "x"}, []),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 0)])
def test_server_refuses_a_speculative_that_is_not_a_boolean(lookup_server, route, body, value):
    r = httpx.post(lookup_server[0] + route, json=body | {"max_tokens": 2, "speculative": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "speculative" in r.json()["error"]["message"]
