"""The torch.distributed connector between two real processes (gloo over TCP on this machine):
first the bare transport, then a whole handoff between two engines, each in its own process."""
import multiprocessing as mp

import pytest
import torch

from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
from course.s04_continuous_batching.engine import LLMEngine
from course.s07_disaggregated.launcher import free_port
from course.s07_disaggregated.testing import (ENGINE_CONFIG, GREEDY, HELD, PROMPT, p2p_consumer, p2p_producer,
                                              random_pool)


@pytest.fixture(scope="module")
def got():
    """Run both processes once; collect everything they report."""
    ctx = mp.get_context("spawn")
    results, handoff = ctx.Queue(), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=fn, args=(port, results, handoff)) for fn in (p2p_producer, p2p_consumer)]
    for p in procs:
        p.start()
    try:
        reports = dict(results.get(timeout=120) for _ in range(8))
        for p in procs:
            p.join(timeout=20)
        reports["exitcodes"] = [p.exitcode for p in procs]
        yield reports
    finally:
        for p in procs:  # every process goes, even when an assertion above failed
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
                p.join()


def test_p2p_blocks_arrive_bitwise_and_unknown_transfers_fail_fast(got):
    assert got["unknown"] == "KVTransferError"  # the producer answered "not held": no wait for a deadline
    assert got["layout"] == "refused"
    assert got["producer"] == "confirmed"
    pool = random_pool(seed=0)  # what the producer's pool held
    layers = got["layers"]
    assert len(layers) == pool.k.shape[0]
    for layer, (k, v) in enumerate(layers):  # blocks 1.. of the held ones, in the producer's order
        assert torch.equal(k, pool.k[layer, HELD[1:]]) and torch.equal(v, pool.v[layer, HELD[1:]])
    assert got["exitcodes"] == [0, 0]


def test_p2p_engine_handoff_kv_received_equals_kv_computed_bitwise(got):
    """Two engines with int8 pools: the codes and their scales arrive as computed."""
    computed, received = got["computed"], got["received"]
    assert len(computed) == 4 and computed[0].dtype == torch.int8 and computed[2].dtype == torch.uint8
    assert all(torch.equal(c, r) for c, r in zip(computed, received))
    tokens, source, free_blocks = got["engine consumer"]
    assert source == "remote" and free_blocks == 24
    unified = LLMEngine(tiny_model("mqa_odd_heads"), byte_tokenizer(), ENGINE_CONFIG)
    assert tokens == unified.generate([PROMPT], GREEDY)[0].token_ids
    assert got["engine producer"] == ({"confirm": 1}, 0)  # the lease ended by the consumer's confirmation
