"""The server against the official openai client, on a live localhost port."""
import asyncio
import json
import math
import threading
import time

import httpx
import openai
import pytest
import torch

from course.final.testing import live_server, metric, tiny_engine
from course.s01_decode_loop.generate import next_token_logits
from course.s01_decode_loop.testing import greedy_reference, hf_twin, tiny_model


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)


def test_server_completion_stream_equals_non_stream(client):
    kw = dict(model="tiny", prompt="Hello", max_tokens=12, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.usage.prompt_tokens == 5 and whole.usage.completion_tokens <= 12
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_server_chat_accepts_string_and_parts_and_counts_usage(client):
    a = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=8, temperature=0)
    b = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert a.choices[0].message.content == b.choices[0].message.content
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == a.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == a.usage.completion_tokens


def test_server_seeded_sampling_is_reproducible(client):
    kw = dict(model="tiny", prompt="abc", max_tokens=10, temperature=1.0, seed=7)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_server_stop_strings(client):
    full = client.completions.create(model="tiny", prompt="Once", max_tokens=16, temperature=0).choices[0].text
    if len(full) < 4:
        pytest.skip("the tiny model stopped too early to pick a stop string")
    out = client.completions.create(model="tiny", prompt="Once", max_tokens=16, temperature=0, stop=[full[2:4]])
    assert out.choices[0].text == full[: full.index(full[2:4])] and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body,status", [
    ("{not json", 400),
    (json.dumps({"prompt": "x", "max_tokens": 0}), 400),
    (json.dumps({"prompt": "x", "temperature": -1}), 400),
    (json.dumps({"prompt": "x", "top_p": 2}), 400),
    (json.dumps({"prompt": "x", "best_of": 2}), 400),          # unknown parameter
    (json.dumps({"prompt": "x", "n": 0}), 400),
    (json.dumps({"prompt": "x", "n": 17}), 400),               # over MAX_N
    (json.dumps({"prompt": "x", "logprobs": 21}), 400),        # over MAX_LOGPROBS
    (json.dumps({"prompt": "x", "stop": [""]}), 400),          # an empty stop string
    (json.dumps({"prompt": "x", "seed": "seven"}), 400),
    (json.dumps({"prompt": [["x"], "y"]}), 400),               # neither strings nor token ids
    (json.dumps([1, 2]), 400),                                 # not an object
    (json.dumps({"prompt": "x" * 600, "max_tokens": 10}), 400),  # over the context, with numbers
    (json.dumps({"max_tokens": 3}), 400),                      # no prompt
])
def test_server_bad_input_gets_4xx_in_openai_shape(server, body, status):
    r = httpx.post(server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": [{"role": "robot", "content": "hi"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},  # needs logprobs: true
    {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
    {"messages": [{"role": "user", "content": "hi"}], "tools": []},        # unsupported parameter
])
def test_server_bad_chat_input_gets_400(server, body):
    r = httpx.post(server[0] + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_server_context_error_states_the_numbers(server):
    r = httpx.post(server[0] + "/v1/completions", json={"prompt": "x" * 600, "max_tokens": 10})
    assert "maximum context length is 512" in r.json()["error"]["message"] and "610" in r.json()["error"]["message"]


def test_server_disconnect_mid_stream_frees_blocks(server):
    url, engine = server
    with httpx.stream("POST", url + "/v1/completions",
                      json={"prompt": "go", "max_tokens": 200, "stream": True, "temperature": 0}) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # hang up
    for _ in range(200):
        if metric(url, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert metric(url, "vllm:num_requests_running") == metric(url, "vllm:num_requests_waiting") == 0
    assert metric(url, "vllm:kv_cache_usage_perc") == 0.0  # every block back in the pool
    assert metric(url, "vllm:request_success_total", finished_reason="abort") >= 1
    assert engine.call(lambda e: (e.has_unfinished(), e.blocks.num_free_blocks, e.requests)) == (False, 64, {})
    ok = httpx.post(url + "/v1/completions", json={"prompt": "next", "max_tokens": 3})
    assert ok.status_code == 200


def test_server_health_and_models(server):
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    card = httpx.get(server[0] + "/v1/models").json()["data"][0]
    assert card["id"] == "tiny" and card["architecture"] == "LlamaForCausalLM"


def test_server_serves_qwen3_as_transformers_generates(byte_tok):
    """Qwen3 (q/k norm, heads x head_dim wider than the hidden size) behind the server: the greedy
    tokens and their logprobs are transformers' own, and /v1/models names the architecture."""
    tokens, logprobs = greedy_reference(hf_twin(tiny_model("qwen3")), byte_tok("Hello").input_ids, 12)
    with live_server(tiny_engine(byte_tok, model="qwen3"), byte_tok) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0, logprobs=1,
                                        extra_body={"ignore_eos": True})
        card = httpx.get(url + "/v1/models").json()["data"][0]
    lp = out.choices[0].logprobs
    assert lp.tokens == [byte_tok.decode([t]) for t in tokens]
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(lp.token_logprobs, logprobs, strict=True))
    assert card["architecture"] == "Qwen3ForCausalLM"


def test_server_n_choices_are_the_seeded_single_requests(client):
    """Choice i of an n-request is the single request with seed + i; usage sums the choices."""
    kw = dict(model="tiny", prompt="abc", max_tokens=8, temperature=1.0)
    many = client.completions.create(**kw, n=3, seed=11)
    assert [c.index for c in many.choices] == [0, 1, 2]
    singles = [client.completions.create(**kw, seed=11 + i).choices[0].text for i in range(3)]
    assert [c.text for c in many.choices] == singles
    assert len(set(singles)) > 1  # the choices differ
    assert many.usage.completion_tokens == sum(
        client.completions.create(**kw, seed=11 + i).usage.completion_tokens for i in range(3))


def test_server_n_streaming_interleaves_choices(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=1.0, seed=3, n=2)
    whole = client.chat.completions.create(**kw)
    texts = ["", ""]
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in whole.choices]


def test_server_logprobs_match_a_full_forward(server, client):
    """The logprobs the server reports are log_softmax of stage 01's naive full forward."""
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    model, tok = server[1].engine.model, server[1].engine.tokenizer
    ids = tok("Hello").input_ids
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens == 6
    for k in range(6):
        logp = torch.log_softmax(next_token_logits(model, ids).float(), dim=-1)
        chosen = int(torch.argmax(logp))  # greedy: the chosen token is the most likely
        assert lp.tokens[k] == tok.decode([chosen])
        assert math.isclose(lp.token_logprobs[k], float(logp[chosen]), abs_tol=1e-4)
        assert len(lp.top_logprobs[k]) <= 3
        assert math.isclose(max(lp.top_logprobs[k].values()), lp.token_logprobs[k], abs_tol=1e-6)
        ids.append(chosen)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(6)]


def test_server_chat_logprobs_stream_equals_whole(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0,
              logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in whole]
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in whole)
    assert all(e.bytes == list(e.token.encode()) for e in whole)
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_server_metrics_count_requests_and_latencies(server, client):
    url = server[0]
    before = metric(url, "vllm:time_to_first_token_seconds_count")
    gen_before = metric(url, "vllm:generation_tokens_total")
    out = client.completions.create(model="tiny", prompt="metrics!", max_tokens=7, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 7
    assert metric(url, "vllm:time_to_first_token_seconds_count") == before + 1
    assert metric(url, "vllm:generation_tokens_total") == gen_before + 7
    assert metric(url, "vllm:inter_token_latency_seconds_count") >= 6
    assert metric(url, "vllm:e2e_request_latency_seconds_sum") > 0
    queries = metric(url, "vllm:prefix_cache_queries_total")
    client.completions.create(model="tiny", prompt="metrics!", max_tokens=2, temperature=0)  # same prompt again
    assert metric(url, "vllm:prefix_cache_queries_total") > queries
    assert metric(url, "vllm:prefix_cache_hits_total") >= 8  # two full 4-token blocks of "metrics!" reused


def test_server_overload_gets_429_while_admitted_requests_complete(byte_tok):
    """With the queue bound at N, the N+1th concurrent request is refused with 429 at once and
    the N admitted ones still complete. The engine is held (steps do nothing) until all N are
    queued, so the test does not depend on timing."""
    engine, gate, bound = tiny_engine(byte_tok, max_waiting=3), threading.Event(), 3
    real_step = engine.engine.step
    engine.engine.step = lambda: real_step() if gate.is_set() else (time.sleep(0.005) or [])
    with live_server(engine, byte_tok) as url:
        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                body = {"prompt": "load", "max_tokens": 5, "temperature": 0}
                admitted = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(bound)]
                while engine.call(lambda e: len(e.scheduler.waiting)) < bound:
                    await asyncio.sleep(0.01)
                refused = await http.post("/v1/completions", json=body)
                gate.set()
                return refused, await asyncio.gather(*admitted)

        refused, done = asyncio.run(scenario())
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
        assert "queue is full" in refused.json()["error"]["message"]
        assert [r.status_code for r in done] == [200] * bound
        assert len({r.json()["choices"][0]["text"] for r in done}) == 1  # same greedy request, same answer


def test_server_n_choices_are_admitted_all_or_none(byte_tok):
    """n choices are admitted together or not at all: no half-served request. n beyond the
    queue bound can never be admitted: 400, not a 429 that invites retrying forever."""
    engine = tiny_engine(byte_tok, max_waiting=3)
    engine.engine.step = lambda: time.sleep(0.005) or []  # never progress: everything stays queued
    with live_server(engine, byte_tok) as url:
        never = httpx.post(url + "/v1/completions", json={"prompt": "x", "n": 4, "max_tokens": 2})
        assert never.status_code == 400 and "can never be admitted" in never.json()["error"]["message"]
        body = {"prompt": "x", "n": 2, "max_tokens": 2, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body) as held:  # two of three slots
            assert held.status_code == 200
            refused = httpx.post(url + "/v1/completions", json={"prompt": "y", "n": 2, "max_tokens": 2})
            assert refused.status_code == 429
            assert engine.call(lambda e: len(e.scheduler.waiting)) == 2  # nothing of the refused pair
        for _ in range(100):  # the held stream was closed: its two requests are aborted
            if engine.call(lambda e: e.requests) == {}:
                break
            time.sleep(0.05)
        assert engine.call(lambda e: (len(e.scheduler.waiting), e.requests)) == (0, {})


def test_server_accepts_guidellms_request_shape(server):
    """The body guidellm 0.8.1 sends: content as parts, max_completion_tokens, ignore_eos and
    vLLM's continuous_usage_stats (usage so far on every chunk)."""
    body = {"model": "tiny", "stream": True, "max_completion_tokens": 5, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    with httpx.stream("POST", server[0] + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    token_chunks = [c for c in chunks if c["choices"]]
    assert [c["usage"]["completion_tokens"] for c in token_chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
