"""The fuzzer's /v1/responses rows (hostile.py, part of stress/fuzz.py's table) against the live
tiny server: clear 4xx answers in OpenAI's shape, whole answers for the valid ones, never a 5xx
or a hang; and the stream check is not vacuous."""
import json

import httpx

from course.final.responses_api.hostile import RESPONSES_CASES, stream_problem
from course.final.stress.fuzz import FuzzReport, check_case


def test_hostile_responses_bodies_get_clear_4xx_and_never_5xx(server):
    report = FuzzReport()
    with httpx.Client(base_url=server[0]) as http:
        for name, route, body in RESPONSES_CASES:
            check_case(http, name, route, body, report, deadline_s=60)
    assert report.ok(), report.summary() + "\n" + "\n".join(report.violations)
    assert report.server_errors == 0 and report.hangs == 0
    assert report.statuses == {400: len(RESPONSES_CASES) - 3, 404: 1, 200: 2}, report.summary()


def test_the_stream_check_catches_a_failed_or_unfinished_stream():
    event = lambda kind: json.dumps({"type": kind, "sequence_number": 0})  # noqa: E731
    assert stream_problem([event("response.created"), event("response.completed")]) == (200, None)
    assert stream_problem([event("response.created"), event("response.failed")])[0] == 500
    assert stream_problem([event("response.created"), event("response.output_text.delta")])[1]
    assert stream_problem([])[1]
