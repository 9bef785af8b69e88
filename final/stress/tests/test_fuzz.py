"""The fuzzer (course.final.stress.fuzz) against a live tiny server: the table of hostile bodies and a
bounded number of generated ones. `python -m course.final.stress.fuzz --cases N` runs more."""
import httpx

from course.final.stress.fuzz import FuzzReport, check_case, run_fuzz, watching
from course.final.testing import live_server, tiny_engine


def test_fuzz_hostile_table_and_generated_bodies_never_5xx_or_hang(byte_tok):
    """With the dashboard's event stream open throughout: snapshots are built while it is fuzzed."""
    with live_server(tiny_engine(byte_tok, max_waiting=8), byte_tok) as url, watching(url) as watched:
        report = run_fuzz(url, cases=150, seed=13, deadline_s=60)
    assert watched["snapshots"] > 0
    assert report.ok(), report.summary() + "\n" + "\n".join(report.violations[:20])
    assert report.cases > 230 and report.statuses.get(200, 0) > 10 and report.statuses.get(400, 0) > 100


def test_fuzz_checks_would_catch_a_bad_server(byte_tok):
    """The fuzzer is not vacuous: a 5xx, an error outside OpenAI's shape and a hang are caught."""
    def app(request: httpx.Request) -> httpx.Response:
        body = request.content
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if body == b"crash":
            return httpx.Response(500, json={"error": {"message": "boom", "type": "x", "code": 500}})
        if body == b"detail":
            return httpx.Response(400, json={"detail": "bad"})
        raise httpx.ReadTimeout("no answer")
    report = FuzzReport()
    with httpx.Client(base_url="http://fake", transport=httpx.MockTransport(app)) as http:
        for body in (b"crash", b"detail", b"hang"):
            check_case(http, body.decode(), "/v1/completions", body, report, deadline_s=1)
    assert (report.server_errors, report.hangs, len(report.violations)) == (1, 1, 3)


def test_fuzz_judges_each_route_by_its_own_answer():
    """/tokenize answers tokens, not choices (vLLM's shape): a whole answer there is no violation,
    while a completion without choices, or a tokenize answer without tokens, is one."""
    answers = {"/tokenize": {"count": 2, "max_model_len": 8, "tokens": [1, 2]}, "/v1/completions": {"id": "x"}}

    def app(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(200, json=answers[request.url.path] if request.content != b"empty" else {})
    report = FuzzReport()
    with httpx.Client(base_url="http://fake", transport=httpx.MockTransport(app)) as http:
        check_case(http, "tokens", "/tokenize", b"{}", report, deadline_s=1)
        assert report.violations == []
        check_case(http, "no tokens", "/tokenize", b"empty", report, deadline_s=1)
        check_case(http, "no choices", "/v1/completions", b"{}", report, deadline_s=1)
    assert [v.split(":")[0] for v in report.violations] == ["no tokens", "no choices"]
