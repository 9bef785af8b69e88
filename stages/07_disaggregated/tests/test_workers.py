"""Two worker processes (prefill, decode), KV over torch.distributed (gloo), driven over HTTP:
the disaggregated path gives what the unified stage-04 engine gives, and no block leaks."""
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.watch import read_snapshots
from course.s07_disaggregated.dispatcher import Dispatcher
from course.s07_disaggregated.launcher import Topology
from course.s07_disaggregated.testing import settled
from course.s07_disaggregated.testing import worker_stats as stats

BLOCK, NUM_BLOCKS = 8, 64
GREEDY = {"temperature": 0, "ignore_eos": True, "logprobs": 0}  # logprobs: a much finer check than tokens


@pytest.fixture(scope="module")
def topology(untied_folder):
    args = ["--kv-blocks", str(NUM_BLOCKS), "--block-size", str(BLOCK), "--max-num-batched-tokens", "32",
            "--lease-s", "60", "--kv-load-timeout-s", "20", "--request-timeout-s", "60"]
    with Topology(untied_folder, connector="p2p", worker_args=args) as topo:  # stops both, pass or fail
        yield topo
    # a SIGTERM is a clean stop: the engine loop and the KV group are closed, the exit code is 0
    assert [w.process.returncode for w in topo.workers] == [0, 0], [w.log_tail() for w in topo.workers]


@pytest.fixture(scope="module")
def dispatcher(topology):
    d = Dispatcher([w.url for w in topology.prefill], [w.url for w in topology.decode])
    yield d
    d.close()


@pytest.fixture(scope="module")
def reference(untied_folder):
    loaded = load_model(untied_folder)

    def run(prompt_ids, max_new_tokens):
        """The unified stage-04 engine's output, with the logprob of each token."""
        engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK))
        rid = engine.add_request(prompt_ids, SamplingParams(max_new_tokens=max_new_tokens, **GREEDY))
        logprobs = []
        while engine.has_unfinished():
            logprobs += [out.event.logprob for out in engine.step()]
        out = engine.requests[rid].seq.output()
        out.logprobs = logprobs
        return out
    return run


def assert_same(out: dict, expect) -> None:
    """Same tokens and text; the same logprobs for the tokens the decode worker computed."""
    assert out["token_ids"] == expect.token_ids
    assert out["text"] == expect.text
    torch.testing.assert_close(torch.tensor(out["logprobs"][1:]), torch.tensor(expect.logprobs[1:]), rtol=0, atol=1e-5)



@pytest.fixture(autouse=True)
def pools_whole_after_each_test(topology):
    yield
    for worker in topology.workers:
        s = settled(worker)
        assert (s["free_blocks"], s["tables"], s["ref_count_sum"], s["held"]) == (NUM_BLOCKS, 0, 0, 0), worker.role


def prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def test_workers_greedy_equals_unified_with_decode_side_prefix_hits(dispatcher, reference):
    fresh = prompts([3, 8, 1, 21, 40, 17], seed=0)  # shorter than a block, exactly one, odd sizes
    full_hit = fresh[3]                              # the decode side now caches its 2 full blocks
    partial_hit = fresh[4][:2 * BLOCK] + prompts([13], seed=1)[0]  # 2 of its 3 full blocks are cached
    cases = [(p, 6) for p in fresh] + [(full_hit, 9), (partial_hit, 5)]
    outs = [dispatcher.generate(p, {"max_new_tokens": n, **GREEDY}) for p, n in cases]
    for (p, n), out in zip(cases, outs):
        assert_same(out, reference(p, n))
    assert [o["kv"]["source"] for o in outs] == ["remote"] * len(cases)
    kv = [{k: v for k, v in o["kv"].items() if k != "load_s"} for o in outs]
    assert kv[-2] == {"source": "remote", "hit_blocks": 2, "loaded_blocks": 1}  # only the partial block
    assert kv[-1] == {"source": "remote", "hit_blocks": 2, "loaded_blocks": 2}


def test_workers_concurrent_requests_equal_unified(dispatcher, reference):
    cases = [(p, n) for p, n in zip(prompts([5, 33, 12, 26], seed=2), [7, 3, 11, 5])]
    with ThreadPoolExecutor(len(cases)) as pool:
        outs = list(pool.map(lambda c: dispatcher.generate(c[0], {"max_new_tokens": c[1], **GREEDY}), cases))
    for (p, n), out in zip(cases, outs):
        assert_same(out, reference(p, n))


def test_workers_confirm_returns_prefill_refcounts_to_zero(topology, dispatcher):
    before = settled(topology.prefill[0])["released"].get("confirm", 0)
    dispatcher.generate(prompts([30], seed=3)[0], {"max_new_tokens": 3, **GREEDY})
    after = settled(topology.prefill[0])
    assert after["released"].get("confirm", 0) == before + 1
    assert after["ref_count_sum"] == 0 and after["free_blocks"] == NUM_BLOCKS


def test_workers_lease_expiry_frees_blocks_and_decode_recomputes(topology, dispatcher, reference):
    prefill = topology.prefill[0]
    before = settled(prefill)["released"].get("expiry", 0)
    prompt = prompts([19], seed=4)[0]
    sampling = {"max_new_tokens": 6, **GREEDY}
    handoff = httpx.post(f"{prefill.url}/prefill", json={"prompt_ids": prompt, "sampling": sampling, "lease_s": 0.05},
                         timeout=60).json()
    after = settled(prefill)  # nobody pulls: the lease runs out
    assert after["released"].get("expiry", 0) == before + 1 and after["ref_count_sum"] == 0
    # a consumer that comes too late hears "gone" and computes the prompt itself: same output
    out = dispatcher.decode(topology.decode[0].url, prompt, sampling, handoff["kv_transfer_params"])
    assert out["kv"]["source"] == "recomputed"
    assert_same(out, reference(prompt, 6))


def test_workers_cancel_frees_at_once(topology):
    prefill = topology.prefill[0]
    before = settled(prefill)["released"].get("cancel", 0)
    body = {"prompt_ids": prompts([27], seed=5)[0], "sampling": {"max_new_tokens": 4, **GREEDY}}
    handoff = httpx.post(f"{prefill.url}/prefill", json=body, timeout=60).json()
    assert stats(prefill)["held"] == 1 and stats(prefill)["free_blocks"] == NUM_BLOCKS - 4
    cancel = lambda: httpx.post(f"{prefill.url}/cancel", json={"transfer_id": handoff["transfer_id"]}, timeout=10)  # noqa: E731
    assert cancel().json() == {"cancelled": True}
    s = stats(prefill)  # no waiting: the cancel was done before its answer came back
    assert (s["held"], s["ref_count_sum"], s["free_blocks"]) == (0, 0, NUM_BLOCKS)
    assert s["released"].get("cancel", 0) == before + 1
    assert cancel().json() == {"cancelled": False}


def test_workers_refuse_bad_requests(topology):
    prefill, decode = topology.prefill[0], topology.decode[0]
    r = httpx.post(f"{prefill.url}/prefill", json={"prompt_ids": [1, 2], "sampling": {"max_tokens": 3}}, timeout=10)
    assert r.status_code == 400 and "max_tokens" in r.text
    r = httpx.post(f"{prefill.url}/prefill", json={"prompt_ids": [1] * (NUM_BLOCKS * BLOCK + 1), "sampling": {}},
                   timeout=10)
    assert r.status_code == 400
    r = httpx.post(f"{decode.url}/generate", json={"prompt_ids": "not a list"}, timeout=10)
    assert 400 <= r.status_code < 500


def test_workers_client_going_away_frees_decode_blocks(topology, dispatcher):
    prefill, decode = topology.prefill[0], topology.decode[0]
    prompt, sampling = prompts([22], seed=6)[0], {"max_new_tokens": 400, **GREEDY}
    handoff = httpx.post(f"{prefill.url}/prefill", json={"prompt_ids": prompt, "sampling": sampling}, timeout=60).json()
    body = {"prompt_ids": prompt, "sampling": sampling, "kv_transfer_params": handoff["kv_transfer_params"]}
    with httpx.stream("POST", f"{decode.url}/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines), next(lines)  # two tokens, then hang up long before the 400th
    # the autouse check below: the decode worker aborted the request and its pool is whole again


def test_each_worker_serves_snapshots_of_its_own_engine(topology, dispatcher):
    """GET /state and /events (stage 04's watch/, plugged in by the CLI that starts each worker): the
    decode worker shows the request it decodes."""
    prefill, decode = topology.prefill[0], topology.decode[0]
    for w in (prefill, decode):
        snap = httpx.get(f"{w.url}/state", timeout=10).json()
        assert snap["pool"]["num_blocks"] == NUM_BLOCKS and snap["num_running"] == 0
    seen = []
    with ThreadPoolExecutor(1) as pool:
        with httpx.stream("GET", f"{decode.url}/events", timeout=30) as events:
            run = pool.submit(dispatcher.generate, prompts([20], seed=9)[0], {"max_new_tokens": 120, **GREEDY})
            for snapshot in read_snapshots(events.iter_lines()):
                seen.append(snapshot)
                if snapshot["num_running"] or len(seen) > 50:
                    break
        run.result(timeout=60)
    busy = next(s for s in seen if s["num_running"])
    assert busy["running"][0]["kind"] == "decode" and busy["pool"]["counts"]["used"] > 0
    assert settled(decode)["free_blocks"] == NUM_BLOCKS  # the stream's reader left; nothing held


def test_a_workers_port_is_held_from_its_start(untied_folder, tmp_path):
    """The launcher binds the port and hands the socket over: nobody can take it while the worker
    loads its model (a port picked here and bound there seconds later could be). That the workers
    then serve on those sockets, every test above shows."""
    import errno
    import socket

    from course.s07_disaggregated.launcher import start_worker, stop_worker
    worker = start_worker("unified", ["--model", str(untied_folder)], tmp_path)
    try:
        port = int(worker.url.rsplit(":", 1)[1])
        with socket.socket() as thief, pytest.raises(OSError) as taken:
            thief.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        stop_worker(worker)
