"""The server against the official openai client, on a live localhost port."""
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from course.final.async_engine import AsyncEngine
from course.final.server import build_app
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(byte_tok):
    byte_tok.chat_template = CHAT_TEMPLATE
    engine = AsyncEngine(LLMEngine(tiny_model("gqa_tied"), byte_tok,
                                   EngineConfig(num_blocks=64, block_size=4, max_waiting=4), [byte_tok.eos_token_id]))
    engine.start()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, byte_tok, "tiny"), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


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
    (json.dumps({"prompt": "x", "n": 2}), 400),                # not supported yet
    (json.dumps({"prompt": "x" * 600, "max_tokens": 10}), 400),  # over the context, with numbers
    (json.dumps({"max_tokens": 3}), 400),                      # no prompt
])
def test_server_bad_input_gets_4xx_in_openai_shape(server, body, status):
    r = httpx.post(server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


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
        if engine.call(lambda e: not e.has_unfinished()):
            break
        time.sleep(0.05)
    assert engine.call(lambda e: (e.has_unfinished(), e.blocks.num_free_blocks)) == (False, 64)
    ok = httpx.post(url + "/v1/completions", json={"prompt": "next", "max_tokens": 3})
    assert ok.status_code == 200


def test_server_health_and_models(server):
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    assert httpx.get(server[0] + "/v1/models").json()["data"][0]["id"] == "tiny"
