"""`priority` through the server with the openai client: a high-priority request takes the seat
of a running low-priority one (asserted on the engine's schedule), both routes carry the field,
and a server that does not schedule by priority refuses a non-zero one rather than ignore it."""
import threading
import time

import openai
import pytest

from course.final.cli import main
from course.final.testing import live_server, start_cli_server, stop_cli_server, tiny_engine
from course.s04_continuous_batching.policy import Priority


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def steps_of(llm, rid):
    return [i for i, step in enumerate(llm.step_log) if rid in [r for r, _, _ in step["chunks"]]]


def test_a_high_priority_request_displaces_a_running_low_priority_one(byte_tok):
    engine = tiny_engine(byte_tok, policy=Priority(), max_num_seqs=1, num_blocks=128)
    with live_server(engine, byte_tok) as url:
        low = client(url).completions.create(model="tiny", prompt="slow and low", max_tokens=300, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True, "priority": 5})
        next(iter(low))  # low is running now
        gate = threading.Event()
        blocker = threading.Thread(target=engine.call, args=(lambda e: gate.wait(30),))
        blocker.start()  # the engine thread waits between two steps ...
        answers = {}
        high = threading.Thread(target=lambda: answers.update(high=client(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "urgent"}], max_tokens=5, temperature=0,
            extra_body={"ignore_eos": True, "priority": 0})))
        high.start()
        for _ in range(200):  # ... until the high-priority request is queued behind it
            if engine._commands.qsize() >= 1 and engine._waiting >= 1:
                break
            time.sleep(0.01)
        gate.set()
        high.join(30)
        rest = "".join(chunk.choices[0].text for chunk in low)
        blocker.join(5)
    assert answers["high"].usage.completion_tokens == 5 and rest
    llm = engine.engine
    low_steps, high_steps = steps_of(llm, 0), steps_of(llm, 1)
    assert low_steps[0] < high_steps[0] and high_steps[-1] < low_steps[-1]  # it cut in ...
    assert not set(range(high_steps[0], high_steps[-1] + 1)) & set(low_steps)  # ... and low waited, paused
    assert llm.scheduler.num_pauses == 1 and llm.scheduler.num_preemptions == 0
    assert llm.requests == {} and llm.blocks.num_free_blocks == llm.blocks.num_blocks


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_fcfs_server_refuses_a_nonzero_priority(server, route):
    c = client(server[0])
    call = c.completions.create if route == "completions" else c.chat.completions.create
    body = {"prompt": "x"} if route == "completions" else {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(openai.BadRequestError, match="scheduling-policy priority"):
        call(model="tiny", max_tokens=2, extra_body={"priority": 3}, **body)
    assert call(model="tiny", max_tokens=2, extra_body={"priority": 0}, **body)  # zero is everyone's default
    with pytest.raises(openai.BadRequestError):
        call(model="tiny", max_tokens=2, extra_body={"priority": "high"}, **body)


def test_the_cli_refuses_a_bad_mlfq_setting_before_loading_a_model(capsys):
    assert main(["serve", "--model", "/nonexistent", "--scheduling-policy", "mlfq", "--mlfq-ratio", "1"]) == 2
    assert "ratio" in capsys.readouterr().err


def test_the_cli_serves_under_mlfq_with_the_tokens_of_fcfs(tiny_folder):
    """`python -m course.final serve --scheduling-policy mlfq` as a user runs it: the same greedy
    answers as under FCFS (scheduling changes order, never content), and a priority is refused
    because MLFQ, not the client, decides the order."""
    prompts = ["hello", "the quick brown fox", "a"]
    answers = {}
    for policy in ("fcfs", "mlfq"):
        proc, url = start_cli_server("--model", str(tiny_folder), "--kv-memory", "1MiB",
                                     "--served-model-name", "tiny", "--scheduling-policy", policy)
        try:
            c = client(url)
            answers[policy] = [c.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0,
                                                    extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
            if policy == "mlfq":
                with pytest.raises(openai.BadRequestError, match="scheduling-policy priority"):
                    c.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"priority": 3})
        finally:
            assert stop_cli_server(proc) == 0
    assert answers["mlfq"] == answers["fcfs"] and all(answers["fcfs"])
