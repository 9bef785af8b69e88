"""The GPU server check's Python half, against a live tiny server on the CPU: every smoke check
of the OpenAI API passes over plain urllib, and the short bench counts every request."""
from course.final.bench.gpu_serve import bench, smoke
from course.final.testing import live_server, tiny_engine


def test_the_smoke_checks_pass_and_the_bench_completes_against_a_live_server(byte_tok):
    with live_server(tiny_engine(byte_tok), byte_tok) as url:
        result = smoke(url)
        assert [c["check"] for c in result["checks"] if not c["ok"]] == [] and result["passed"]
        assert len(result["checks"]) == 5
        summary = bench(url, num_requests=3, rate=float("inf"), prompt_chars=20, output_tokens=4)["summary"]
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (3, 0, 12)
