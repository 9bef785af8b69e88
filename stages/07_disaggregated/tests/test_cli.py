"""`python -m course.s07_disaggregated`: the whole topology from one command, prompts as every
stage takes them, or `serve` to keep it running."""
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s04_continuous_batching.engine import LLMEngine
from course.s07_disaggregated.cli import parse_args
from course.s07_disaggregated.launcher import free_port
from course.s07_disaggregated.testing import alive, stop_front_and_workers

PROMPTS = ["first prompt", "second, longer prompt than the first one", "x"]


def unified(folder, prompts, n):
    loaded = load_model(folder)
    ids = [encode_prompt(loaded.tokenizer, p) for p in prompts]
    return LLMEngine(loaded.model, loaded.tokenizer).generate(ids, SamplingParams(max_new_tokens=n, temperature=0,
                                                                                 ignore_eos=True))


@pytest.mark.parametrize("command, connector", [([], "p2p"), (["serve"], "shared_storage")])
def test_cli_runs_prompts_like_the_unified_engine_with_or_without_serve(untied_folder, tmp_path, command, connector):
    """The stage's contract (no subcommand) and `serve` with prompts: both run them through the
    workers, print them as stage 01 does, and stop the workers."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    proc = subprocess.run([sys.executable, "-m", "course.s07_disaggregated", *command, "--prefill", "1", "--decode", "1",
                           "--connector", connector, "--model", str(untied_folder), "--prompts-file", str(prompts),
                           "--max-new-tokens", "6", "--ignore-eos", "--json"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == PROMPTS
    assert [r["token_ids"] for r in rows] == [o.token_ids for o in unified(untied_folder, PROMPTS, 6)]
    assert all(r["kv"]["source"] == "remote" for r in rows)
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", proc.stderr)]
    assert len(pids) == 2 and not any(alive(p) for p in pids)  # the workers went with it


def up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_cli_policy_and_replicas_flags_are_parsed():
    args = parse_args(["serve"])[1]
    assert (args.command, args.policy, args.replicas, args.prefill, args.decode) == ("serve", "cache_aware", 0, 1, 1)
    assert parse_args(["--prompt", "hi", "--replicas", "2"])[1].command is None  # prompts need no subcommand
    with pytest.raises(SystemExit):
        parse_args([])  # neither prompts nor `serve`: nothing to do
    args = parse_args(["serve", "--replicas", "3", "--policy", "least_loaded"])[1]
    assert (args.policy, args.replicas) == ("least_loaded", 3)
    for bad in (["--policy", "random"], ["--prefill", "0"], ["--replicas", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(["serve", *bad])


def test_cli_serve_replicas_route_by_prefix_until_ctrl_c(untied_folder, tmp_path):
    """`serve --replicas 2` (no prompts): the front answers, a prompt's extension goes to the
    replica that served the prompt (cache-aware, the default), Ctrl-C stops everything."""
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "course.s07_disaggregated", "serve", "--model",
                                 str(untied_folder), "--port", str(port), "--replicas", "2"], stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 180
        while not up(f"http://127.0.0.1:{port}/health"):  # the workers start first, then the front
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/generate", timeout=60,
                       json={"prompt": PROMPTS[0], "sampling": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}})
        assert r.status_code == 200
        assert r.json()["token_ids"] == unified(untied_folder, PROMPTS[:1], 5)[0].token_ids
        greedy = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
        prompt_ids = list(range(40, 80))  # 2 full blocks of 16, then its extension
        where = [httpx.post(f"http://127.0.0.1:{port}/generate", timeout=60, json={
            "prompt_ids": ids, "sampling": greedy}).json()["route"]["replica"] for ids in (prompt_ids, prompt_ids + [7] * 9)]
        assert where[0] == where[1]
        router = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["router"]
        assert router["policy"] == "cache_aware" and router["first"]["reasons"].get("cache_hit", 0) >= 1
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:  # on failure too: the front first (it stops its workers), then any worker left
        stop_front_and_workers(proc, lambda: [int(p) for p in re.findall(r"\(pid (\d+)\)", log.read_text())])
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", log.read_text())]
    assert len(pids) == 2 and not any(alive(p) for p in pids), log.read_text()
