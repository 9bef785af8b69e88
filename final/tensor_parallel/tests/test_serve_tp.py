"""`python -m course.final serve --tensor-parallel-size 2` through the official openai client:
the answers of the TP=1 server (the same plain forward; prompt logprobs within 1e-4); a rank killed mid-stream: the stream
ends with an error, the server exits, no process remains; refused combinations, by name."""
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from course.final.async_engine import AsyncEngine
from course.final.cli import main
from course.final.engine import Engine
from course.final.metrics import ServerMetrics
from course.final.testing import CHAT_TEMPLATE, live_server, start_cli_server, stop_cli_server
from course.s01_decode_loop.testing import save_hf_folder, tiny_model
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s07_disaggregated.testing import alive

PROMPTS = ["Hello there", "The quick brown fox", "a"]
SERVE = ["--kv-blocks", "128", "--block-size", "4", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    path = tmp_path_factory.mktemp("tp_serve")
    byte_tok.chat_template = CHAT_TEMPLATE
    save_hf_folder(tiny_model("qwen2_bias"), byte_tok, path)
    return path


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def all_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    """Have these processes all exited (multiprocessing's resource tracker leaves just after its parent)?"""
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def kill_the_spawned_rank(ranks: list[int]) -> None:
    os.kill(next(pid for pid in ranks if "spawn_main" in open(f"/proc/{pid}/cmdline").read()), signal.SIGKILL)


def exit_status_and_log(proc, timeout_s: float = 60.0) -> tuple[int | None, str]:
    """The server's exit status once it has gone by itself (None if it had to be killed), and its log."""
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = None
        proc.kill()
        proc.wait()
    return status, proc.stdout.read()


def answers(url: str) -> list:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def complete(prompt, **kw):
        return client.completions.create(model="m", prompt=prompt, max_tokens=12, **kw).choices[0].text

    with ThreadPoolExecutor(4) as pool:  # at once: one continuous batch
        greedy = list(pool.map(lambda p: complete(p, temperature=0), PROMPTS))
    seeded = complete("Once upon", temperature=0.8, seed=3)
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                          temperature=0).choices[0].message.content
    scored = client.completions.create(model="m", prompt="The cat sat on", max_tokens=0, echo=True, logprobs=1)
    return [greedy, seeded, chat], scored.choices[0].logprobs.token_logprobs[1:]  # rank 0's logits outside a step


def test_openai_client_through_tp2_equals_tp1(folder, byte_tok):
    loaded = load_model(folder)
    config = KernelEngineConfig(num_blocks=128, block_size=4, max_num_seqs=8)
    tp1 = AsyncEngine(Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids), ServerMetrics("m"))
    with live_server(tp1, loaded.tokenizer) as url:
        want = answers(url)
    proc, url = start_cli_server("--model", str(folder), "--tensor-parallel-size", "2", *SERVE)
    ranks = children(proc.pid)
    try:
        texts, prompt_logprobs = answers(url)
        assert texts == want[0]
        assert prompt_logprobs == pytest.approx(want[1], abs=1e-4)
        # the dashboard's data: rank 0 schedules for the group, so its pool is the group's
        state = httpx.get(url + "/v1/engine/state", timeout=30).json()
        assert state["engine"]["num_blocks"] == 128 and state["pool"]["counts"]["used"] == 0
    finally:
        assert stop_cli_server(proc) == 0
    log = proc.stdout.read()
    assert "tensor parallel rank 1 of 2: weights" in log and "KV pool" in log
    assert all_gone(ranks)


def test_a_rank_killed_mid_stream_errors_the_request_and_the_server_exits(folder):
    proc, url = start_cli_server("--model", str(folder), "--tensor-parallel-size", "2", *SERVE)
    ranks = children(proc.pid)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        stream = client.completions.create(model="m", prompt="abc", max_tokens=500, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        kill_the_spawned_rank(ranks)
        with pytest.raises(openai.APIError, match="tensor parallel group failed"):
            for _ in stream:
                pass
    finally:
        status, log = exit_status_and_log(proc)
    assert status == 1 and "tensor parallel group failed" in log
    assert all_gone(ranks)


@pytest.mark.parametrize("flags,message", [
    (["--disaggregated"], "--disaggregated does not combine"),
    (["--fused"], "--fused does not combine"),
    (["--attention-backend", "cpu"], "--attention-backend cpu does not combine"),
    (["--speculative-method", "eagle"], "eagle does not combine"),
])
def test_unsupported_combinations_are_refused_by_name(folder, flags, message, capsys):
    assert main(["serve", "--model", str(folder), "--tensor-parallel-size", "2", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_size_that_does_not_divide_the_heads_is_refused_before_any_rank_starts(folder, capsys):
    assert main(["serve", "--model", str(folder), "--tensor-parallel-size", "4"]) == 2
    assert "tensor parallel size 4 must divide the attention heads (6), KV heads (2)" in capsys.readouterr().err


def test_a_rank_killed_while_idle_stops_the_server(folder):
    """No request in flight: the watchdog sees the rank go, and the server drains and exits."""
    proc, _ = start_cli_server("--model", str(folder), "--tensor-parallel-size", "2", *SERVE)
    ranks = children(proc.pid)
    kill_the_spawned_rank(ranks)
    status, log = exit_status_and_log(proc)
    assert status == 1 and "rank 1 exited with code -9" in log
    assert all_gone(ranks)


def test_ctrl_c_reaching_every_rank_drains_and_exits_cleanly(folder):
    """A terminal's Ctrl-C reaches every process of the group, the spawned rank first here: the
    followers leave it to rank 0, which drains, stops them and exits 0, with no traceback."""
    proc, _ = start_cli_server("--model", str(folder), "--tensor-parallel-size", "2", *SERVE)
    ranks = children(proc.pid)
    for pid in [*ranks, proc.pid]:
        os.kill(pid, signal.SIGINT)
    status, log = exit_status_and_log(proc)
    assert status == 0 and "Traceback" not in log, log
    assert all_gone(ranks)
