"""The soak test (python -m course.final.stress.soak): a short soak passes on the tiny model, and the
soak is not vacuous: it reports a server that drops a token, a lost answer and a mismatch."""
import itertools

import pytest
import torch

from course.final.stress.soak import Answer, Job, check_complete, compare, own_server, plan, run_soak
from course.final.testing import live_server, tiny_engine


def test_soak_short_run_on_tiny_model_has_no_violations():
    """30 mixed requests, 8 at a time, on a pool of 24 blocks of 4 tokens: preemptions, hang-ups
    and give-ups happen, yet every answer is complete and equals the request sent alone."""
    with own_server(kv_blocks=24, max_num_seqs=8) as url:
        report = run_soak(url, requests=30, concurrency=8, seed=2, max_seconds=50)
    assert report.violations == []
    assert report.preemptions > 0 and report.disconnected > 0 and report.gave_up > 0
    assert report.completed + report.disconnected + report.gave_up == report.requests == 30
    assert report.compared == report.completed + report.disconnected and report.lost == report.mismatches == 0
    assert set(report.gauges.values()) == {0.0}


def test_soak_plan_is_reproducible_and_mixed():
    jobs = plan(60, seed=0)
    assert [j.body for j in jobs] == [j.body for j in plan(60, seed=0)]
    assert {j.route for j in jobs} == {"completions", "chat"} and {j.stream for j in jobs} == {True, False}
    assert {j.n for j in jobs} == {1, 2, 3} and {j.body["temperature"] for j in jobs} == {0.0, 0.8}
    assert any("stop" in j.body for j in jobs) and any(j.body.get("ignore_eos") for j in jobs)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model on a busy CPU (see own_server)
    yield
    torch.set_num_threads(threads)


def test_soak_reports_a_server_that_drops_tokens(byte_tok, one_thread):
    """Every 7th token the engine produces is lost on its way to the client: the soak must say so."""
    engine = tiny_engine(byte_tok)
    deliver, count = engine._deliver, itertools.count()

    def drop_some(request_id, event):
        if getattr(event, "finish_reason", "") is None and next(count) % 7 == 3:
            return
        deliver(request_id, event)

    engine._deliver = drop_some
    with live_server(engine, byte_tok) as url:
        report = run_soak(url, requests=12, concurrency=4, seed=1, max_seconds=40)
    assert not report.ok and report.mismatches > 0
    assert any("alone" in v for v in report.violations)


def test_soak_checks_flag_a_lost_answer_and_a_mismatch():
    job = Job(0, "completions", {"prompt": "x", "max_tokens": 4, "n": 2, "temperature": 0.0, "stream": True,
                                 "stream_options": {"include_usage": True}})
    cut = Answer(stream=True, status=200, texts={0: "ab"}, finish={0: "length"}, chunks={0: 4})
    problems = check_complete(job, cut)
    assert any("[DONE]" in p for p in problems) and any("expected 0..1" in p for p in problems)
    assert any("no usage" in p for p in problems)
    usage = {"prompt_tokens": 1, "completion_tokens": 8, "total_tokens": 9}
    soak = Answer(stream=True, status=200, texts={0: "abcd", 1: "abcd"}, finish={0: "length", 1: "length"},
                  chunks={0: 4, 1: 4}, usage=usage, done=True)
    assert check_complete(job, soak) == []
    alone = Answer(status=200, texts={0: "abcd", 1: "abce"}, finish={0: "length", 1: "length"}, usage=usage)
    assert compare(job, soak, alone) == ["choice 1: 'abcd' (length) under load, 'abce' (length) alone"]
    soak.abandoned, soak.texts = "disconnected", {0: "ab", 1: "ax"}  # hung up: a prefix is right
    assert len(compare(job, soak, alone)) == 1 and "does not begin" in compare(job, soak, alone)[0]
