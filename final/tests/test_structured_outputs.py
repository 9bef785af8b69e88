"""`response_format` through the official openai client: every choice, streamed or not, is JSON
valid for the schema (stage 08's masks inside stage 04's batched engine); bad schemas get 400."""
import json

import httpx
import jsonschema
import openai
import pytest

from course.final.testing import live_server, tiny_engine

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99},
                                           "tag": {"enum": ["a", "b", "c"]}},
          "required": ["ok", "n", "tag"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def server(byte_tok):
    with live_server(tiny_engine(byte_tok), byte_tok) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def test_structured_chat_choices_validate(client):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=3,
                                         temperature=1.0, seed=0, max_tokens=60, response_format=FORMAT)
    assert len(out.choices) == 3
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_structured_stream_validates_and_equals_the_whole(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "go"}], temperature=0.0, max_tokens=60,
                  response_format=FORMAT)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), SCHEMA)


def test_structured_completion_route_too(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 60, "temperature": 0,
                                                     "response_format": FORMAT}, timeout=60)
    assert r.status_code == 200
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), SCHEMA)


@pytest.mark.parametrize("response_format,message", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True},
                                             "strict": True}}, "uniqueItems"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}, "frobnicate"),
    ({"type": "json_schema"}, "json_schema is required"),
    ({"type": "xml"}, "type"),
])
def test_bad_response_formats_get_400(server, response_format, message):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "max_tokens": 5, "response_format": response_format})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_ignore_eos_with_a_schema_is_refused(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "ignore_eos": True,
                                                     "response_format": FORMAT})
    assert r.status_code == 400 and "ignore_eos" in r.json()["error"]["message"]


RELAXED = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                     "uniqueItems": True, "maxItems": 2},
                                            "score": {"type": "number", "minimum": 0.5, "maximum": 9.5}},
           "required": ["tags", "score"], "x-internal-id": 7}


@pytest.mark.parametrize("stream", [False, True])
def test_best_effort_schema_is_served_with_its_warnings_in_a_header(server, stream):
    """Without strict: true, a keyword no grammar enforces (uniqueItems) is relaxed, not refused,
    and the response says so; an unknown keyword is ignored (an annotation), and said too. What
    is enforced still holds: the output validates once uniqueItems is left out."""
    fmt = {"type": "json_schema", "json_schema": {"name": "tags", "schema": RELAXED}}
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 60, "temperature": 0,
            "response_format": fmt, "stream": stream}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        warnings = json.loads(r.headers["x-structured-output-warnings"])
        text = r.read().decode()
    assert [(w["keyword"], w["at"]) for w in warnings] == [("x-internal-id", "#"), ("uniqueItems", "#/properties/tags")]
    if stream:
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    else:
        content = json.loads(text)["choices"][0]["message"]["content"]
    enforced = json.loads(json.dumps(RELAXED))
    del enforced["properties"]["tags"]["uniqueItems"]
    jsonschema.validate(json.loads(content), enforced)


def test_an_exact_schema_gets_no_warnings_header(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 60, "temperature": 0,
                                                     "response_format": FORMAT}, timeout=60)
    assert r.status_code == 200 and "x-structured-output-warnings" not in r.headers


UNBOUNDED = {"type": "object", "properties": {"note": {"type": "string"}, "n": {"type": "number"}},
             "required": ["note", "n"]}


@pytest.mark.parametrize("stream", [False, True])
def test_best_effort_answers_finish_within_max_tokens(server, stream):
    """Answers that finish: an unbounded string gets the serving default bound (said in the header), and the
    JSON closes before max_tokens: a complete, valid document, shorter than the model would write, so its
    finish_reason says "length"."""
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": UNBOUNDED}}
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "temperature": 0,
            "response_format": fmt, "stream": stream}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        warnings = json.loads(r.headers["x-structured-output-warnings"])
        text = r.read().decode()
    assert {(w["keyword"], w["at"], w["kind"]) for w in warnings} == {
        ("maxLength", "#/properties/note", "default-bound"), ("maxDigits", "#/properties/n", "default-bound")}
    if stream:
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    else:
        choice = json.loads(text)["choices"][0]
        content, finish = choice["message"]["content"], [choice["finish_reason"]]
    assert finish == ["length"]
    jsonschema.validate(json.loads(content), UNBOUNDED)


def test_an_answer_that_fits_max_tokens_comes_back_unchanged(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": UNBOUNDED}}

    def ask(max_tokens):
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens, "temperature": 0,
                "response_format": fmt}
        return httpx.post(server + "/v1/chat/completions", json=body, timeout=60).json()

    free = ask(200)
    assert free["choices"][0]["finish_reason"] == "stop"
    needed = free["usage"]["completion_tokens"]
    assert ask(needed)["choices"][0] == free["choices"][0]
    cut = ask(needed - 1)["choices"][0]
    assert cut["finish_reason"] == "length"
    jsonschema.validate(json.loads(cut["message"]["content"]), UNBOUNDED)


def test_an_engine_that_refuses_grammars_is_asked_before_any_schema_compiles(byte_tok, monkeypatch):
    """A refusal costs no compile: the request says it is constrained before its grammar exists."""
    from course.final.structured import GrammarCache

    compiled = []
    original = GrammarCache.processors

    async def counting(self, *args, **kwargs):
        compiled.append(args)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(GrammarCache, "processors", counting)
    engine = tiny_engine(byte_tok)
    engine.refuse = lambda request: "no grammars here" if request.constrained else None
    with live_server(engine, byte_tok) as url:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "response_format": FORMAT}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and "no grammars here" in r.json()["error"]["message"]
        assert compiled == []
        r = httpx.post(url + "/v1/completions", json={**body, "response_format": {"type": "text"}}, timeout=30)
        assert r.status_code == 200, r.text


def test_a_new_schema_compiles_without_its_masks_and_they_are_kept_for_later_requests(byte_tok):
    """The server's cache compiles the automaton only; a position's mask is made when a request
    first reaches it, kept in the cached grammar for the next request, and equals the mask
    precomputing would have made."""
    import asyncio
    import random

    from course.final.structured import GrammarCache
    from course.s08_structured.bench.testing import EXAMPLE_SCHEMAS, random_valid_path
    from course.s08_structured.json_schema import json_schema_to_grammar
    from course.s08_structured.matcher import GrammarMatcher

    def build(budget):
        return json_schema_to_grammar(EXAMPLE_SCHEMAS["order"], budget=budget)

    lazy = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id])
    eager = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id], precompute=True)
    compiled = asyncio.run(lazy.compiled("order", build))
    reference = asyncio.run(eager.compiled("order", build))
    assert not compiled.masks and reference.masks   # precomputed: every position that reads a byte
    path = random_valid_path(GrammarMatcher(reference), random.Random(0), max_tokens=60)
    mine, theirs = GrammarMatcher(compiled), GrammarMatcher(reference)
    for t in path:
        assert (mine.next_token_mask() == theirs.next_token_mask()).all()
        assert mine.accept_token(t) and theirs.accept_token(t)
    made = len(compiled.masks)
    assert 0 < made < len(reference.masks)   # only the positions this answer reached
    assert asyncio.run(lazy.compiled("order", build)) is compiled and len(compiled.masks) == made


def test_the_full_servers_masks_are_made_by_the_c_walk_and_equal_the_lessons(byte_tok):
    """plug_in_json_schema gives the grammar cache stage 08's walk in C (native/) where a compiler
    is found; the masks it makes along a path equal those the lesson's walk precomputes."""
    import asyncio
    import random

    from course.final.cli import plug_in_json_schema
    from course.final.structured import GrammarCache
    from course.s08_structured.bench.testing import random_valid_path
    from course.s08_structured.matcher import GrammarMatcher
    from course.s08_structured.native.walker import NativeClassifier, native_unavailable

    class Server:
        grammars = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id])

    plug_in_json_schema(None, Server)
    if native_unavailable() is not None:
        pytest.skip(f"no C walk here: {native_unavailable()}")
    assert isinstance(Server.grammars.classify, NativeClassifier)
    compiled = asyncio.run(Server.grammars.compiled("answer", lambda budget: Server.grammars.schema_grammar(
        SCHEMA, True, budget)))
    reference = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id], precompute=True)
    reference.schema_grammar = Server.grammars.schema_grammar
    expected = asyncio.run(reference.compiled("answer", lambda budget: reference.schema_grammar(SCHEMA, True, budget)))
    path = random_valid_path(GrammarMatcher(expected), random.Random(1), max_tokens=40)
    mine, theirs = GrammarMatcher(compiled), GrammarMatcher(expected)
    for t in path:
        assert (mine.next_token_mask() == theirs.next_token_mask()).all()
        assert mine.accept_token(t) and theirs.accept_token(t)
    assert compiled.masks


def test_the_full_server_builds_the_rules_schemas_share_at_start_up(byte_tok):
    """plug_in_json_schema gives the grammar cache stage 08's kept rule automata, and prepare()
    builds the ones most schemas share (a bounded string, numbers, arrays) before any request."""
    from course.final.cli import plug_in_json_schema
    from course.final.structured import GrammarCache
    from course.s08_structured.serving import rule_cache

    class Server:
        grammars = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id])

    plug_in_json_schema(None, Server)
    rule_cache.forget()
    Server.grammars.prepare()
    assert {"string_max64", "number_max16", "integer_max16", "array"} <= {name for name, _ in rule_cache._kept}
