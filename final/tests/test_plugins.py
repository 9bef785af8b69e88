"""The lesson's server alone, and the one seam its rooms plug into: `build_app`'s plug-ins (fields
mixed into the bodies, routes, steps taken over), `AsyncEngine.after_turn`, `Engine.after_forward`."""
from fastapi.testclient import TestClient
from pydantic import BaseModel

from course.final.protocol import with_fields
from course.final.server import build_app
from course.final.testing import tiny_engine

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def test_the_lesson_alone_serves_text_and_refuses_what_only_a_room_adds(byte_tok):
    engine = tiny_engine(byte_tok)
    app = build_app(engine, byte_tok, "tiny")
    engine.start()
    try:
        with TestClient(app) as http:
            assert http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["finish_reason"] == "length"
            assert http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3}).json()["usage"] == {
                "prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
            refused = [http.post("/v1/chat/completions", json=CHAT | extra) for extra in (
                {"tools": []}, {"prompt_logprobs": 1}, {"response_format": {"type": "json_object"}})]
            routes = [http.get(path).status_code for path in ("/dashboard", "/v1/engine/state")]
            tokenize = http.post("/tokenize", json={"prompt": "x"}).status_code
    finally:
        engine.shutdown()
    assert [r.status_code for r in refused] == [400] * 3
    assert "tools" in refused[0].json()["error"]["message"]
    assert "JSON Schema compiler" in refused[2].json()["error"]["message"]
    assert routes == [404, 404] and tokenize == 404


class Shout(BaseModel):
    shout: bool = False

    def chat_prompt(self, tokenizer):
        messages, tools = super().chat_prompt(tokenizer)
        return [m | {"content": m["content"].upper()} for m in messages] if self.shout else messages, tools


def test_a_plug_in_mixes_fields_adds_routes_takes_a_step_and_hooks_the_engine(byte_tok):
    """Called before the routes exist: the chat route takes the mixed body, and its method runs."""
    engine, seen = tiny_engine(byte_tok), {"turns": 0, "rows": 0, "answers": 0}
    engine.after_turn.append(lambda llm: seen.update(turns=seen["turns"] + 1))
    engine.engine.after_forward.append(lambda chunks, hidden: seen.update(rows=seen["rows"] + len(hidden)))

    def plug_in(app, server):
        server.chat_body = with_fields(server.chat_body, Shout)
        app.get("/hello")(lambda: {"hello": server.model_name})
        lesson = server.answer_chat

        async def counted(body, ids, max_tokens):
            seen["answers"] += 1
            seen["prompt"] = byte_tok.decode(ids)
            return await lesson(body, ids, max_tokens)
        server.answer_chat = counted

    app = build_app(engine, byte_tok, "tiny", plugins=[plug_in])
    engine.start()
    try:
        with TestClient(app) as http:
            assert http.get("/hello").json() == {"hello": "tiny"}
            assert http.post("/v1/chat/completions", json=CHAT | {"shout": True}).status_code == 200
    finally:
        engine.shutdown()
    assert seen["answers"] == 1 and "user: HI" in seen["prompt"]
    assert seen["turns"] > 0 and seen["rows"] >= 4  # the prompt's rows and each decode's
