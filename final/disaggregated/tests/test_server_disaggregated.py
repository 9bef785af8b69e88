"""`python -m course.final serve --disaggregated --prefill 1 --decode 1`: the OpenAI API over
stage 07's worker processes, as a user runs it (a real process, a real port), against the
unified server on the same model folder."""
import contextlib
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

from course.final.cli import main
from course.final.engine import Engine
from course.final.testing import CHAT_TEMPLATE, free_port, live_server, metric
from course.final.async_engine import AsyncEngine
from course.final.metrics import ServerMetrics
from course.s01_decode_loop.testing import byte_tokenizer, save_hf_folder, tiny_model
from course.s01_decode_loop.weights import load_model
from course.s04_continuous_batching.watch import read_snapshots
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s07_disaggregated.testing import alive, settled, stop_front_and_workers

POOL = ["--kv-blocks", "256", "--block-size", "4"]
PROMPTS = ["hello", "a longer prompt, past a few blocks of four tokens", "x"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An untied tiny model (a tied one repeats a single token) with a chat template."""
    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("tiny_chat")
    save_hf_folder(tiny_model("mqa_odd_heads", seed=0), tok, path)
    return path


@pytest.fixture(scope="module")
def unified(folder):
    loaded = load_model(folder)
    engine = AsyncEngine(Engine(loaded.model, loaded.tokenizer, KernelEngineConfig(num_blocks=256, block_size=4),
                                loaded.eos_token_ids), ServerMetrics("tiny"))
    with live_server(engine, loaded.tokenizer) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


@contextlib.contextmanager
def serving(folder, log, *topology: str):
    """`serve --disaggregated TOPOLOGY` on the folder: (base URL, its process, its workers (role, url, pid))."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "course.final", "serve", "--disaggregated", *topology,
                                 "--model", str(folder), "--served-model-name", "tiny",
                                 "--port", str(port), "--drain-timeout", "2", *POOL], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    workers = lambda: [SimpleNamespace(role=r, url=u, pid=int(p))  # noqa: E731
                       for r, u, p in re.findall(r"(\w+) worker: (\S+) \(pid (\d+)\)", log.read_text())]
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield SimpleNamespace(url=url, proc=proc, workers=workers(), log=log)
    finally:  # on failure too: the server first (it stops its workers), then any worker left
        stop_front_and_workers(proc, lambda: [w.pid for w in workers()], signal.SIGTERM)


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    with serving(folder, tmp_path_factory.mktemp("serve") / "serve.log", "--prefill", "1", "--decode", "1") as s:
        yield s


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def completion(c, stream: bool, **kw) -> tuple[list[str], list[str]]:
    """(text per choice, finish reason per choice), whole or gathered from the stream."""
    out = c.completions.create(model="tiny", stream=stream, **kw)
    if not stream:
        return [x.text for x in out.choices], [x.finish_reason for x in out.choices]
    texts, reasons = {}, {}
    for chunk in out:
        for x in chunk.choices:
            texts[x.index] = texts.get(x.index, "") + x.text
            reasons[x.index] = x.finish_reason or reasons.get(x.index)
    return [texts[i] for i in sorted(texts)], [reasons[i] for i in sorted(texts)]


def chat(c, stream: bool, **kw) -> tuple[str, str]:
    out = c.chat.completions.create(model="tiny", stream=stream, **kw)
    if not stream:
        return out.choices[0].message.content, out.choices[0].finish_reason
    text, reason = "", None
    for chunk in out:
        for x in chunk.choices:
            text += x.delta.content or ""
            reason = x.finish_reason or reason
    return text, reason


def test_an_int8_kv_cache_travels_between_the_workers_and_answers_as_a_unified_int8_server(folder, tmp_path):
    """`--kv-cache-dtype int8` reaches every worker: the prompt's codes and scales are handed over,
    and greedy answers equal one in-process server's with the same pool."""
    loaded = load_model(folder)
    config = KernelEngineConfig(num_blocks=256, block_size=4, kv_cache_dtype="int8")
    engine = AsyncEngine(Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids), ServerMetrics("tiny"))
    with live_server(engine, loaded.tokenizer) as url, \
            serving(folder, tmp_path / "serve.log", "--prefill", "1", "--decode", "1", "--kv-cache-dtype", "int8") as s:
        local = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for prompt in PROMPTS:
            kw = dict(prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
            assert completion(client(s), False, **kw) == completion(local, False, **kw)
        decode = next(w for w in s.workers if w.role == "decode")
        assert settled(decode)["loaded_blocks"] > 0  # the prompts' blocks came from the prefill worker


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_and_completions_equal_the_unified_server(server, unified, stream):
    remote = client(server)
    for prompt in PROMPTS:
        kw = dict(prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        assert completion(remote, stream, **kw) == completion(unified, stream, **kw)
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}]
        kw = dict(messages=messages, max_tokens=10, temperature=0)
        assert chat(remote, stream, **kw) == chat(unified, stream, **kw)
    # a stop string, and n seeded samples (choice i draws with seed + i on either server)
    kw = dict(prompt=PROMPTS[1], max_tokens=16, temperature=0, stop=["e"])
    assert completion(remote, stream, **kw) == completion(unified, stream, **kw)
    kw = dict(prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7, n=2, extra_body={"ignore_eos": True})
    assert completion(remote, stream, **kw) == completion(unified, stream, **kw)
    usage = remote.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True}).usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (2, 3)


@pytest.mark.parametrize("body,option", [
    ({"prompt": "hi", "logprobs": 1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "hi", "priority": 1}, "priority"),
    ({"prompt": ["hi", "yo"], "echo": True, "logprobs": 1, "max_tokens": 0}, "logprobs"),
    ({"prompt": [104, 105], "prompt_logprobs": 1}, "prompt logprobs"),
])
def test_unsupported_options_are_refused_by_name(server, body, option):
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(server.url + route, json={"max_tokens": 2, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert option in r.json()["error"]["message"] and "--disaggregated" in r.json()["error"]["message"]


def test_a_client_that_leaves_mid_stream_frees_the_workers(server):
    body = {"prompt": "go on", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    aborted = metric(server.url, "vllm:request_success_total", 0, finished_reason="abort")
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 4:
                break  # hang up after a few tokens
    deadline = time.monotonic() + 30
    while metric(server.url, "vllm:request_success_total", 0, finished_reason="abort") == aborted:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.05)
    for w in server.workers:  # nothing running, nothing held: every block back in its pool
        s = settled(w)
        assert (s["running"], s["waiting"], s["held"], s["ref_count_sum"]) == (0, 0, 0, 0), (w.role, s)


def test_the_dashboard_shows_each_workers_engine(server):
    """The front runs no engine: /v1/engine/state gathers every worker's snapshot, and
    /dashboard/events?worker=NAME relays that worker's own stream."""
    assert httpx.get(server.url + "/dashboard/workers", timeout=10).json() == {"workers": ["prefill-0", "decode-0"]}
    snaps = httpx.get(server.url + "/v1/engine/state", timeout=10).json()["workers"]
    assert set(snaps) == {"prefill-0", "decode-0"} and all(s["pool"]["num_blocks"] == 256 for s in snaps.values())
    r = httpx.get(server.url + "/v1/engine/state?worker=decode-7", timeout=10)
    assert r.status_code == 404 and "decode-0" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/dashboard/events?worker=nobody", timeout=10).status_code == 404
    body = {"prompt": "watch me", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    seen = []
    with httpx.stream("GET", server.url + "/dashboard/events?worker=decode-0", timeout=30) as events:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=60)
            for snapshot in read_snapshots(events.iter_lines()):
                seen.append(snapshot)
                if snapshot["num_running"] or len(seen) > 50:
                    break
            assert answer.result().status_code == 200
    assert any(row["kind"] == "decode" for snap in seen for row in snap["running"])


@pytest.mark.browser
def test_the_dashboard_page_picks_a_worker_and_shows_its_batch(server, tmp_path):
    from course.final.dashboard.testing import PAGE_STATE, chromium, console_errors
    from selenium.webdriver.support.ui import Select
    with chromium() as driver:
        driver.get(server.url + "/dashboard")
        deadline = time.monotonic() + 10
        while not driver.find_element("id", "worker").is_displayed() and time.monotonic() < deadline:
            time.sleep(0.05)
        picker = Select(driver.find_element("id", "worker"))
        assert [o.text for o in picker.options] == ["prefill-0", "decode-0"]
        picker.select_by_visible_text("decode-0")
        body = {"prompt": "the page watches", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
        # waves of requests until the page has shown a row of the decode worker's batch: on a busy
        # machine the page's stream may catch up only after a wave has finished (no race on one wave)
        answers, states, deadline = [], [], time.monotonic() + 120
        with ThreadPoolExecutor(4) as pool:
            while not any(s["rows"] for s in states) and time.monotonic() < deadline:
                wave = [pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=60) for _ in range(8)]
                answers += wave
                while not all(a.done() for a in wave):
                    states.append(driver.execute_script(PAGE_STATE))
                    time.sleep(0.1)
        while states[-1]["rows"] and time.monotonic() < deadline + 30:
            time.sleep(0.1)
            states.append(driver.execute_script(PAGE_STATE))
        driver.save_screenshot(str(tmp_path / "dashboard-decode-worker.png"))
        errors = console_errors(driver)
    assert all(a.result().status_code == 200 for a in answers)
    assert max(s["rows"] for s in states) >= 1, "the decode worker's batch never showed"
    assert states[-1]["rows"] == 0 and states[-1]["status"] == "live"
    assert not errors, errors


def test_sigterm_stops_the_server_and_every_worker(server):
    assert [w.role for w in server.workers] == ["prefill", "decode"]
    assert all(alive(w.pid) for w in server.workers)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0, server.log.read_text()
    assert not any(alive(w.pid) for w in server.workers), server.log.read_text()


def test_replicas_with_round_robin_serve_the_same_answers_and_stop_on_ctrl_c(folder, unified, tmp_path):
    with serving(folder, tmp_path / "serve.log", "--replicas", "2", "--routing-policy", "round_robin") as s:
        assert [w.role for w in s.workers] == ["unified", "unified"]
        for stream in (False, True):  # two requests each: one per replica
            kw = dict(prompt=PROMPTS[1], max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
            assert completion(client(s), stream, **kw) == completion(unified, stream, **kw)
            kw = dict(messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=6, temperature=0)
            assert chat(client(s), stream, **kw) == chat(unified, stream, **kw)
        s.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert s.proc.wait(timeout=60) == 0, s.log.read_text()
        assert not any(alive(w.pid) for w in s.workers), s.log.read_text()


@pytest.mark.parametrize("argv,message", [
    (["--disaggregated", "--speculative-method", "lookup"],
     "--speculative-method is not supported with --disaggregated"),
    (["--disaggregated", "--scheduling-policy", "priority"], "--scheduling-policy is not supported"),
    (["--prefill", "2"], "--prefill needs --disaggregated"),
    (["--disaggregated", "--replicas", "2", "--prefill", "1"], "not both"),
])
def test_flags_that_do_not_fit_are_refused(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err
