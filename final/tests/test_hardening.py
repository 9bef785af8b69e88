"""One bad request must never hurt another: each test here names a way a server can fail one
request and its neighbours with it (a 500, a hang, a stalled event loop, a request that keeps
running for nobody), and checks that this one does not."""
import asyncio
import json
import signal
import threading
import time

import httpx
import pytest

from course.final.errors import safe_text
from course.final.server import ServerLimits
from course.final.testing import live_server, metric, running_server, tiny_engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def post(url: str, route: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + route, content=content, headers={"content-type": "application/json"}, timeout=30, **kw)


def assert_openai_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    return err["message"]


def wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def idle(url: str) -> bool:
    return (metric(url, "vllm:num_requests_running") == metric(url, "vllm:num_requests_waiting") == 0
            and metric(url, "vllm:kv_cache_usage_perc") == 0)


def held_engine(byte_tok, **config):
    """A tiny engine whose steps do nothing until `gate` is set: requests stay queued."""
    engine, gate = tiny_engine(byte_tok, **config), threading.Event()
    real_step = engine.engine.step
    engine.engine.step = lambda: real_step() if gate.is_set() else (time.sleep(0.005) or [])
    return engine, gate


# ---- 1. a seed no generator can take fails that request alone, at validation --------------
@pytest.mark.parametrize("body", [{"seed": 2**64}, {"seed": -(2**63) - 1}, {"seed": 2**63}, {"seed": 1e30}])
def test_hardening_seed_out_of_range_is_400(server, body):
    assert "seed" in assert_openai_error(post(server[0], COMPLETIONS, {"prompt": "x", **body}), 400)


def test_hardening_largest_seed_with_n_is_served(server):
    """seed + i for the n choices must stay in a generator's range: the largest seed works."""
    r = post(server[0], COMPLETIONS, {"prompt": "x", "seed": 2**63 - 1, "n": 3, "max_tokens": 3})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3


def test_hardening_failing_request_does_not_fail_its_neighbours(server):
    """A request that fails inside the engine step fails alone (500 for it); the stream beside
    it completes. The failure is injected into one request's logits processor."""
    url, engine = server
    real_submit = engine.submit

    def submit_with_a_broken_one(request):
        if request.prompt_ids == list(b"break me"):
            def broken(output_ids, logits):
                raise RuntimeError("boom in one request")
            for p in request.params:
                p.logits_processors = [broken]
        return real_submit(request)
    engine.submit = submit_with_a_broken_one
    try:
        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                good = asyncio.create_task(http.post(COMPLETIONS, json={
                    "prompt": "fine", "max_tokens": 40, "temperature": 0, "ignore_eos": True}))
                bad = await http.post(COMPLETIONS, json={"prompt": "break me", "max_tokens": 5})
                return bad, await good
        bad, good = asyncio.run(scenario())
    finally:
        engine.submit = real_submit
    assert "boom in one request" in assert_openai_error(bad, 500)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 40
    assert metric(url, "vllm:request_success_total", finished_reason="error") >= 1


# ---- 2, 3, 9: invalid text, empty prompts, unreadable bodies: 400 in OpenAI's shape --------
@pytest.mark.parametrize("route,body", [
    (COMPLETIONS, '{"prompt": "hi \\ud800 there"}'),
    (CHAT, '{"messages": [{"role": "user", "content": "hi \\udfff"}]}'),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}'),
    (COMPLETIONS, '{"prompt": "x", "stop": ["\\ud800"]}'),
    (COMPLETIONS, '{"prompt": "x", "user": "\\ud800"}'),
    (COMPLETIONS, '{"prompt": "x", "\\ud800": 1}'),  # in a key: the unknown-field error quotes it
    (COMPLETIONS, '{"prompt": "x", "user": {"\\ud800": "\\udc00"}}'),  # under a key that has one
    (COMPLETIONS, b'{"prompt": "hi \xed\xa0\x80 there"}'),  # a surrogate as raw (invalid) UTF-8
    (COMPLETIONS, b'{"prompt": "\xff\xfe"}'),
    (COMPLETIONS, "[" * 100_000 + "]" * 100_000),  # too deep for any JSON parser's stack
    (COMPLETIONS, '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}"),
    (COMPLETIONS, '{"prompt": ""}'),
    (CHAT, '{"messages": [{"role": "user", "content": ""}], "max_tokens": 600}'),
    (COMPLETIONS, '{"prompt": "x", "temperature": NaN}'),
    (COMPLETIONS, '{"prompt": "x", "top_p": Infinity}'),
    (COMPLETIONS, '{"prompt": "x", "max_tokens": 100000000000000000000000}'),
    (COMPLETIONS, '{"prompt": "x", "stop": ' + json.dumps(["s"] * 17) + "}"),
])
def test_hardening_bad_input_is_400_in_openai_shape(server, route, body):
    assert_openai_error(post(server[0], route, body), 400)


def test_hardening_empty_prompt_says_so(server):
    assert "empty" in assert_openai_error(post(server[0], COMPLETIONS, {"prompt": ""}), 400)


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nowhere", 404), ("GET", COMPLETIONS, 405),
                                                ("DELETE", "/health", 405)])
def test_hardening_unknown_routes_answer_in_openai_shape(server, method, path, status):
    assert_openai_error(httpx.request(method, server[0] + path), status)


def test_hardening_error_messages_survive_lone_surrogates():
    assert safe_text("bad \ud800 text").encode("utf-8") == b"bad \\ud800 text"
    assert len(safe_text("x" * 10**6)) < 3000


# ---- 4, 5: schemas are bounded: refused fast with the limit named, compiles can stop --------
def nested(depth: int, leaf) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def deep_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("schema,limit", [
    (deep_arrays(400), "max_depth"),
    ({"enum": [nested(900, 1)]}, "max_depth"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
      "required": [f"p{i}" for i in range(3000)]}, "max_"),
    ({"enum": [f"value number {i}" for i in range(15000)]}, "max_enum_values"),
    ({"type": "string", "maxLength": 1e20, "strict": True}, "max_repeat"),
    ({"type": "string", "minLength": 10**9, "strict": True}, "max_repeat"),
    ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "max_"),
])
def test_hardening_hostile_schemas_are_refused_fast_naming_the_limit(server, schema, limit):
    schema = dict(schema)
    strict = schema.pop("strict", None)
    body = {"prompt": "x", "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, **({"strict": strict} if strict is not None else {})}}}
    start = time.monotonic()
    message = assert_openai_error(post(server[0], COMPLETIONS, body), 400)
    assert limit in message and time.monotonic() - start < 20  # a hang guard, not a benchmark


@pytest.mark.parametrize("bound", [{"maxLength": 1e20}, {"minLength": 10**9}, {"maxLength": 32767}])
def test_hardening_a_huge_string_bound_is_relaxed_by_name_in_best_effort(server, bound):
    """Best-effort writes no bound past 256 characters, so there is nothing to count: the bound is
    relaxed and reported in the warnings header (beside the serving default bound that then
    applies), and the answer is served."""
    schema = {"type": "object", "properties": {"note": {"type": "string", **bound}}, "required": ["note"]}
    body = {"prompt": "x", "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    r = post(server[0], COMPLETIONS, body)
    assert r.status_code == 200, r.text
    warnings = json.loads(r.headers["x-structured-output-warnings"])
    assert (next(iter(bound)), "#/properties/note") in [(w["keyword"], w["at"]) for w in warnings]


def test_hardening_schema_compile_deadline_is_a_400_naming_the_expensive_part(byte_tok):
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": {   # ~40,000 automaton states
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^.{0,5000}$"}}}}}
    with live_server(tiny_engine(byte_tok), byte_tok, limits=ServerLimits(grammar_timeout_s=0.3)) as url:
        message = assert_openai_error(post(url, COMPLETIONS, {"prompt": "x", "response_format": fmt}), 400)
        assert "timeout_s" in message and "pattern at #/properties/a" in message
        assert httpx.get(url + "/health").status_code == 200


@pytest.fixture
def endless_compile(monkeypatch):
    """Replace the server's grammar compile by one that runs until its budget stops it, as a
    real compile checks its budget. Yields (started, stopped) events."""
    from course.final import structured
    started, stopped = threading.Event(), threading.Event()

    def compile_until_stopped(grammar, info, precompute=True, minimize=True, budget=None, **how):
        started.set()
        try:
            while True:
                budget.check()
                time.sleep(0.01)
        finally:
            stopped.set()
    monkeypatch.setattr(structured, "compile_grammar", compile_until_stopped)
    return started, stopped


BOOLEAN_FORMAT = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "boolean"}}}


def test_hardening_compile_is_cancelled_when_its_client_leaves(byte_tok, endless_compile):
    """A client that leaves while its schema compiles stops the compile (it does not run on)."""
    started, stopped = endless_compile
    with live_server(tiny_engine(byte_tok), byte_tok, limits=ServerLimits(grammar_timeout_s=600)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + COMPLETIONS, json={"prompt": "x", "response_format": BOOLEAN_FORMAT}, timeout=1.0)
        assert started.is_set()
        assert stopped.wait(10)  # the client's timeout closed the connection: the compile ended


def test_hardening_shutdown_cancels_a_running_compile(byte_tok, endless_compile):
    """Ctrl-C during a compile: the compile stops, its request gets 503, the server exits."""
    started, stopped = endless_compile
    limits = ServerLimits(grammar_timeout_s=600)
    with running_server(tiny_engine(byte_tok), byte_tok, limits=limits, drain_timeout=1) as (url, srv):
        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                pending = asyncio.create_task(http.post(COMPLETIONS, json={
                    "prompt": "x", "response_format": BOOLEAN_FORMAT}))
                await asyncio.to_thread(started.wait, 10)
                srv.handle_exit(signal.SIGINT, None)
                return await pending
        answer = asyncio.run(scenario())
        assert "shutting down" in assert_openai_error(answer, 503)
        assert stopped.wait(10)
        wait_for(lambda: srv.should_exit)


# ---- 6: overload is answered on the event loop, at once; n past the bound is a 400 ----------
def test_hardening_429_does_not_wait_for_the_engine_step(byte_tok):
    """The engine thread is stuck inside a step; a request past the queue bound still gets its
    429 (admission is decided on the event loop), and so does /health answer."""
    engine, stuck, release = tiny_engine(byte_tok, max_waiting=2), threading.Event(), threading.Event()
    real_step = engine.engine.step

    def step():
        if engine.engine.scheduler.waiting and not release.is_set():
            stuck.set()
            release.wait(30)  # the engine thread blocks here, as in a very long step
        return real_step()
    engine.engine.step = step
    with live_server(engine, byte_tok) as url:
        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                body = {"prompt": "load", "max_tokens": 3}
                admitted = [asyncio.create_task(http.post(COMPLETIONS, json=body)) for _ in range(2)]
                await asyncio.to_thread(stuck.wait, 10)
                refused = await http.post(COMPLETIONS, json=body, timeout=5)
                health = await http.get("/health", timeout=5)
                release.set()
                return refused, health, await asyncio.gather(*admitted)
        refused, health, done = asyncio.run(scenario())
    assert "queue is full" in assert_openai_error(refused, 429)
    assert health.status_code == 200 and [r.status_code for r in done] == [200, 200]


# ---- 7: a client that leaves stops its request, queued or running, streamed or not ----------
def slowed_engine(byte_tok, seconds_per_step: float = 0.02, **config):
    """A tiny engine that takes `seconds_per_step` per step, so a long request is still running
    when a test acts on it."""
    engine = tiny_engine(byte_tok, **config)
    real_step = engine.engine.step
    engine.engine.step = lambda: time.sleep(seconds_per_step) or real_step()
    return engine


def test_hardening_non_streaming_client_that_gives_up_stops_its_request(byte_tok):
    with live_server(slowed_engine(byte_tok), byte_tok) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + COMPLETIONS, json={"prompt": "long", "max_tokens": 200, "ignore_eos": True},
                       timeout=0.5)
        wait_for(lambda: idle(url), seconds=3)  # long before its 200 tokens (~4 s) could be done
        assert metric(url, "vllm:request_success_total", finished_reason="abort") == 1
        assert metric(url, "vllm:generation_tokens_total") < 200


def test_hardening_stream_abandoned_while_queued_never_runs(byte_tok):
    engine, gate = held_engine(byte_tok)
    with live_server(engine, byte_tok) as url:
        with httpx.stream("POST", url + COMPLETIONS, json={"prompt": "queued", "stream": True}) as r:
            assert r.status_code == 200
            wait_for(lambda: engine.call(lambda e: len(e.scheduler.waiting)) == 1)
        wait_for(lambda: engine.call(lambda e: e.requests) == {})  # aborted while still queued
        gate.set()
        assert engine.call(lambda e: e.step_log) == []  # its prefill never ran


# ---- 8: a huge body is refused before parsing; tokenizing never blocks the event loop --------
def test_hardening_body_over_the_limit_is_413(byte_tok):
    with live_server(tiny_engine(byte_tok), byte_tok, limits=ServerLimits(max_request_bytes=10_000)) as url:
        assert_openai_error(post(url, COMPLETIONS, {"prompt": "x" * 20_000}), 413)
        chunked = (b'{"prompt": "' + b"x" * 1000 for _ in range(20))  # no Content-Length: counted as it comes
        assert_openai_error(httpx.post(url + COMPLETIONS, content=chunked), 413)
        assert post(url, COMPLETIONS, {"prompt": "x" * 100, "max_tokens": 2}).status_code == 200


def test_hardening_megabyte_prompt_is_refused_without_tokenizing(server, monkeypatch):
    url, engine = server
    tok = engine.engine.tokenizer
    monkeypatch.setattr(type(tok), "__call__", lambda *a, **k: pytest.fail("tokenized a hopeless prompt"))
    message = assert_openai_error(post(url, COMPLETIONS, {"prompt": "x" * 10**6}), 400)
    assert "maximum context length" in message


def test_hardening_tokenizing_runs_off_the_event_loop(server, monkeypatch):
    """While one request's tokenization is stuck, the server still answers everyone else."""
    url, engine = server
    tok, entered, release = engine.engine.tokenizer, threading.Event(), threading.Event()
    real_call = type(tok).__call__

    def slow_call(self, text, *a, **k):
        if text == "slow":
            entered.set()
            release.wait(10)
        return real_call(self, text, *a, **k)
    monkeypatch.setattr(type(tok), "__call__", slow_call)

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            slow = asyncio.create_task(http.post(COMPLETIONS, json={"prompt": "slow", "max_tokens": 2}))
            await asyncio.to_thread(entered.wait, 10)
            health = await http.get("/health", timeout=5)  # the stuck tokenizer waits 10 s: a blocked loop fails
            release.set()
            return health, await slow
    health, slow = asyncio.run(scenario())
    assert health.status_code == 200 and slow.status_code == 200


# ---- 10: the role comes in each choice's first chunk only -----------------------------------
def test_hardening_stream_sends_the_role_once_per_choice(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "n": 2, "stream": True,
            "temperature": 1.0, "seed": 1}
    with httpx.stream("POST", server[0] + CHAT, json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks if c["choices"]]
    for index in (0, 1):
        mine = [d for i, d in deltas if i == index]
        assert mine[0]["role"] == "assistant" and all("role" not in d for d in mine[1:])


# ---- graceful shutdown: 503 for newcomers, a deadline for the rest, then exit ---------------
def test_hardening_shutdown_drains_then_stops_what_is_left(byte_tok):
    """SIGTERM (handle_exit): new requests get 503 and /health 503; a request that finishes
    within the drain completes; one that would outlive it ends with a clear error."""
    with running_server(slowed_engine(byte_tok), byte_tok, drain_timeout=1.5) as (url, srv):
        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                short = asyncio.create_task(http.post(COMPLETIONS, json={
                    "prompt": "short", "max_tokens": 20, "ignore_eos": True}))
                long = asyncio.create_task(http.post(COMPLETIONS, json={  # ~4 s: outlives the drain
                    "prompt": "long", "max_tokens": 200, "ignore_eos": True}))
                await asyncio.sleep(0.3)
                srv.handle_exit(signal.SIGTERM, None)
                newcomer = await http.post(COMPLETIONS, json={"prompt": "late", "max_tokens": 2})
                health = await http.get("/health")
                return newcomer, health, await short, await long
        newcomer, health, short, long = asyncio.run(scenario())
        assert "shutting down" in assert_openai_error(newcomer, 503)
        assert health.status_code == 503
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 20
        assert "shutting down" in assert_openai_error(long, 503)
        wait_for(lambda: srv.should_exit)
