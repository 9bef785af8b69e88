"""The dispatcher with the router wired in, on real worker processes (2 prefill + 2 decode, gloo):
cache-aware routing keeps a prompt and its extensions on one prefill worker (round-robin does
not), a client that cancels between prefill and decode frees the prefill blocks at once, and a
decode worker killed mid-stream costs no request: each completes once, with the unified tokens."""
import os
import signal
import threading
import time

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s07_disaggregated.dispatcher import Dispatcher
from course.s07_disaggregated.launcher import Topology
from course.s07_disaggregated.testing import settled
from course.s07_disaggregated.testing import worker_stats as stats

BLOCK, NUM_BLOCKS = 8, 128
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def topology(untied_folder):
    args = ["--kv-blocks", str(NUM_BLOCKS), "--block-size", str(BLOCK), "--max-num-batched-tokens", "64",
            "--lease-s", "60", "--kv-load-timeout-s", "20", "--request-timeout-s", "60"]
    with Topology(untied_folder, num_prefill=2, num_decode=2, worker_args=args) as topo:
        yield topo
    # the killed worker included: every process is gone once the topology is stopped
    assert all(w.process.poll() is not None for w in topo.workers)


def make_dispatcher(topology, policy="cache_aware") -> Dispatcher:
    return Dispatcher([w.url for w in topology.prefill], [w.url for w in topology.decode], policy=policy,
                      block_size=BLOCK)


@pytest.fixture(scope="module")
def unified(untied_folder):
    loaded = load_model(untied_folder)

    def run(prompts, max_new_tokens):
        engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(num_blocks=4 * NUM_BLOCKS, block_size=BLOCK))
        return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, **GREEDY))]
    return run



@pytest.fixture(autouse=True)
def pools_whole_after_each_test(topology):
    yield
    for worker in topology.workers:
        if worker.process.poll() is None:  # (the killed one cannot answer)
            s = settled(worker)
            assert (s["free_blocks"], s["tables"], s["ref_count_sum"], s["held"]) == (NUM_BLOCKS, 0, 0, 0)


def prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def test_cache_aware_sends_a_prompt_and_its_extensions_to_one_prefill_worker(topology, unified):
    system, turn1, turn2, other = prompts([4 * BLOCK, 5, 2 * BLOCK + 3, 4 * BLOCK], seed=10)
    family = [system, system + turn1, system + turn1 + turn2]
    dispatcher = make_dispatcher(topology)
    hits_before = {w.url: stats(w)["prefix_hit_tokens"] for w in topology.prefill}
    outs = [dispatcher.generate(p, {"max_new_tokens": 4, **GREEDY}) for p in family + [other]]
    where = [o["route"]["prefill"] for o in outs]
    assert len(set(where[:3])) == 1 and where[3] != where[0]  # unrelated prompt: the emptier worker
    assert [o["token_ids"] for o in outs] == unified(family + [other], 4)
    assert dispatcher.first.stats.reasons == {"cache_miss": 2, "cache_hit": 2}
    # the chosen worker's own prefix cache did reuse the blocks: at least the 4 system blocks, twice
    hits = {w.url: stats(w)["prefix_hit_tokens"] - hits_before[w.url] for w in topology.prefill}
    assert hits[where[0]] >= 2 * len(system) and hits[where[3]] == 0
    dispatcher.close()

    rr = make_dispatcher(topology, "round_robin")  # for contrast: the extension goes elsewhere
    assert rr.generate(family[0], {"max_new_tokens": 2, **GREEDY})["route"]["prefill"] != \
        rr.generate(family[1], {"max_new_tokens": 2, **GREEDY})["route"]["prefill"]
    rr.close()


def test_cancel_between_prefill_and_decode_frees_prefill_blocks_at_once(topology):
    cancel = threading.Event()

    class ClientLeavesDuringPrefill(Dispatcher):
        def _prefill(self, url, body):
            handoff = super()._prefill(url, body)
            self.prefilled_on = url
            cancel.set()  # the client hangs up now, with the blocks held for a decode worker
            return handoff

    d = ClientLeavesDuringPrefill([w.url for w in topology.prefill], [w.url for w in topology.decode],
                                  block_size=BLOCK)
    out = d.generate(prompts([3 * BLOCK + 1], seed=11)[0], {"max_new_tokens": 8, **GREEDY}, cancel=cancel)
    assert out["token_ids"] == [] and out["finish_reason"] == "abort"
    prefill = next(w for w in topology.prefill if w.url == d.prefilled_on)
    s = stats(prefill)  # no waiting: the cancel was answered before generate returned
    assert (s["held"], s["ref_count_sum"], s["free_blocks"]) == (0, 0, NUM_BLOCKS)
    assert s["released"].get("cancel", 0) >= 1
    assert all(stats(w)["running"] == 0 for w in topology.decode)  # no decode was started
    assert d.second.outstanding_requests == {w.url: 0 for w in topology.decode}
    assert d.first.outstanding_requests == {w.url: 0 for w in topology.prefill}
    d.close()


def test_decode_worker_killed_mid_stream_every_request_completes_once(topology, unified):
    """Several requests stream at once; one decode worker is SIGKILLed while they do. Each client
    still gets exactly one answer, the unified engine's tokens, none twice (the retry replays and
    skips what was sent), and the survivors' pools end whole (the autouse check)."""
    dispatcher = make_dispatcher(topology)
    victim, survivor = topology.decode
    cases = prompts([9, 20, 13, 30], seed=12)
    n_new = 300  # long enough that every stream is still running when the worker dies
    received = [[] for _ in cases]
    finals, errors = [None] * len(cases), []

    def client(i):
        try:
            for line in dispatcher.stream(cases[i], {"max_new_tokens": n_new, **GREEDY}):
                received[i].append(line["token_id"])
                if line.get("finish_reason"):
                    finals[i] = line
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    # kill while the victim is still generating: its own count, not the clients' (a client slowed
    # by a busy machine may have read 2 tokens of a stream the worker has already finished), and
    # once the router has counted what it sent there (the worker may start a request first)
    while not (stats(victim)["running"] and dispatcher.second.outstanding_requests[victim.url]):
        assert time.monotonic() < deadline, "no request ran on the decode worker to be killed"
        time.sleep(0.005)
    os.kill(victim.process.pid, signal.SIGKILL)
    at_kill = [len(r) for r in received]
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert received == unified(cases, n_new), at_kill  # complete, nothing repeated, nothing missing
    attempts = [f["route"]["attempts"] for f in finals]
    assert max(attempts) == 2 and all(f["route"]["decode"] == survivor.url for f in finals if f["route"]["attempts"] == 2)
    assert dispatcher.second.dead == {victim.url}
    # the router is told when each request left: the loads are back to zero
    assert set(dispatcher.second.outstanding_requests.values()) == {0}
    assert set(dispatcher.first.outstanding_requests.values()) == {0}
    dispatcher.close()
