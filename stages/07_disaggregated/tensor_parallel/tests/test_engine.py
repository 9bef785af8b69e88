"""Two processes over gloo: rank 0 (this test process) runs stage 06's engine on shard 0, a spawned
rank 1 follows. Outputs are compared with the TP=1 engine on the same folder: greedy tokens
exactly, logits at atol 1e-5 / rtol 1e-4 (float32; a sum split in two rounds differently)."""

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec
from course.s07_disaggregated.tensor_parallel.testing import TP_TINY, reference_engine, save_tp_tiny, tp_engine
from course.s07_disaggregated.testing import alive

PROMPTS = [list(range(40, 40 + n)) for n in (5, 13, 30, 22)]
GREEDY = SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True)
PER_FORWARD = 2 * TP_TINY.num_hidden_layers + 1  # o_proj and down per layer, the embedding once


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_tiny"))


@pytest.fixture(scope="module")
def group(folder):
    with TensorParallel.start(TPSpec(2, str(folder), timeout_s=60, threads=1)) as tp:
        loaded, model = tp.load_shard()
        yield tp, loaded, model
    assert not any(alive(p.pid) for p in tp.processes)


SETTINGS = {"chunked_prefill": dict(num_blocks=64, block_size=4, max_num_batched_tokens=16),
            "preemption": dict(num_blocks=14, block_size=4, max_num_seqs=4)}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_tp2_greedy_equals_tp1_through_continuous_batching(group, folder, setting):
    config = SETTINGS[setting]
    ref = reference_engine(folder, **config)
    want = [o.token_ids for o in ref.generate(PROMPTS, GREEDY)]
    engine = tp_engine(*group, **config)
    group[0].comm.reset_counts()
    got = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    assert got == want
    steps = len(engine.step_log)
    assert [s["chunks"] for s in engine.step_log] == [s["chunks"] for s in ref.step_log]  # same schedule
    if setting == "preemption":
        assert engine.scheduler.num_preemptions > 0
    else:  # prompts longer than the budget went in chunks
        assert any(n > 1 and n < len(p) for s in engine.step_log for _, n, _ in s["chunks"] for p in PROMPTS[2:3])
    calls = group[0].comm.calls
    assert calls["all_reduce"] == PER_FORWARD * steps  # 2 per layer + 1, every step
    assert calls["all_gather"] == sum(1 for s in engine.step_log if s["chunks"])  # the logits, once a step


def test_tp2_logits_equal_tp1_and_each_rank_holds_half_the_kv(group, folder):
    ref = reference_engine(folder, num_blocks=16, block_size=4)
    engine = tp_engine(*group, num_blocks=16, block_size=4)
    seqs, rows = [(0, 19, [3, 1, 4, 0, 5])], list(range(19))  # a prompt at odd block ids, every row scored
    ids = list(range(60, 79))
    want, got = ref.runner.run(ids, seqs, rows), engine.runner.run(ids, seqs, rows)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-4)
    assert got.logits.shape == (19, TP_TINY.vocab_size)
    assert engine.cache.nbytes * 2 == ref.cache.nbytes  # this rank's KV heads only
    # logits asked outside a step (prompt logprobs) bring rank 1 into the gather
    torch.testing.assert_close(engine.model.compute_logits(got.hidden[:3]), want.logits[:3], atol=1e-5, rtol=1e-4)


def test_seeded_sampling_reproduces_and_equals_tp1(group, folder):
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True)
    want = [o.token_ids for o in reference_engine(folder).generate(PROMPTS[:2], params)]
    assert [o.token_ids for o in tp_engine(*group).generate(PROMPTS[:2], params)] == want
    assert [o.token_ids for o in tp_engine(*group).generate(PROMPTS[:2], params)] == want
