"""The engine hooks, in one process, through the shared-storage connector (no sockets): the
handed-over request computes exactly what the unified stage-04 engine computes."""
import time
from concurrent.futures import Future

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s07_disaggregated.engine import DisaggConfig, DisaggEngine
from course.s07_disaggregated.shared_storage import SharedStorageConnector

BLOCK = 8
NUM_BLOCKS = 48


def greedy(n):
    # logprobs too: a tiny random model's tokens barely move when its K/V are a little wrong; its logprobs do
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True, logprobs=0)


def random_prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture
def pair(request, tmp_path, byte_tok):
    """A producer and a consumer engine on one model, each with its own pool, one shared folder."""
    # untied: varied outputs (a tied tiny model repeats one token)
    model = tiny_model(getattr(request, "param", "mqa_odd_heads"))
    config = EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=32)
    make = lambda: DisaggEngine(model, byte_tok, config, connector=SharedStorageConnector(tmp_path),  # noqa: E731
                                disagg=DisaggConfig(lease_s=60))
    prefill, decode = make(), make()
    yield model, prefill, decode
    for engine in (prefill, decode):  # both pools whole after every test
        assert engine.blocks.num_free_blocks == NUM_BLOCKS and not engine.blocks.tables
        assert all(b.ref_count == 0 for b in engine.blocks.blocks)


def run_prefill(prefill, prompts, params):
    """Run prompts to their first token; return each one's transfer parameters."""
    ids = [prefill.add_prefill_request(p, sp) for p, sp in zip(prompts, params)]
    while prefill.has_unfinished():
        prefill.step()
    return [prefill.exports.pop(i) for i in ids]


def step_to_end(engine, ids):
    """Step until done; returns the logprob of every token the engine sampled, per request."""
    logprobs = {i: [] for i in ids}
    while engine.has_unfinished():
        if isinstance(engine, DisaggEngine):
            engine.service_kv()
        for out in engine.step():
            logprobs[out.request_id].append(out.event.logprob)
    return [logprobs[i] for i in ids]


def run_decode(decode, prompts, params, transfers):
    ids = [decode.add_transferred_request(p, sp, t) for p, sp, t in zip(prompts, params, transfers)]
    decode.last_logprobs = step_to_end(decode, ids)
    decode.service_kv()
    return [decode.requests[i].seq.output() for i in ids], ids


def disaggregated(prefill, decode, prompts, params):
    outs, ids = run_decode(decode, prompts, params, run_prefill(prefill, prompts, params))
    prefill.service_kv()  # reads the consumers' confirmations: the leases end
    return outs, ids


def unified(model, tok, prompts, params):
    engine = LLMEngine(model, tok, EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    unified.last_logprobs = step_to_end(engine, ids)
    return [engine.requests[i].seq.output() for i in ids]


def assert_same_as_unified(model, tok, decode, outs, prompts, params):
    """Same tokens and text, and the same logprobs for every token the decode side computed
    (its first token was sampled by the prefill side)."""
    expect = unified(model, tok, prompts, params)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expect]
    assert [o.text for o in outs] == [e.text for e in expect]
    for got, want in zip(decode.last_logprobs, unified.last_logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want[1:]), rtol=0, atol=1e-5)


def origin(decode, rid) -> dict:
    """Where the request's prompt K/V came from (without the load's duration)."""
    return {k: v for k, v in decode.kv_origin[rid].items() if k != "load_s"}


@pytest.mark.parametrize("pair", ["mqa_odd_heads", "qwen3"], indirect=True)
def test_handoff_greedy_equals_unified(pair, byte_tok):
    model, prefill, decode = pair
    prompts = random_prompts([3, 8, 1, 17, 40, 24, 9])  # shorter than a block, exactly one, odd sizes
    params = [greedy(n) for n in [12, 5, 9, 1, 7, 10, 2]]
    outs, _ = disaggregated(prefill, decode, prompts, params)
    assert_same_as_unified(model, byte_tok, decode, outs, prompts, params)
    assert prefill.released["confirm"] == len(prompts) and not prefill.leases


def test_handoff_skips_prefill_on_decode_side(pair):
    _, prefill, decode = pair
    prompt = random_prompts([21])[0]
    _, (rid,) = disaggregated(prefill, decode, [prompt], [greedy(4)])
    first = next(chunk for step in decode.step_log for chunk in step["chunks"] if chunk[0] == rid)
    assert first == (rid, 1, 21)  # one token (the handed-over first token) on top of 21 loaded ones
    assert origin(decode, rid) == {"source": "remote", "hit_blocks": 0, "loaded_blocks": 3}


def test_handoff_sampled_request_continues_producers_random_stream(pair, byte_tok):
    model, prefill, decode = pair
    prompts = random_prompts([13, 30], seed=3)
    params = [SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)] * 2
    outs, _ = disaggregated(prefill, decode, prompts, params)
    assert [o.token_ids for o in outs] == [e.token_ids for e in unified(model, byte_tok, prompts, params)]


@pytest.mark.parametrize("shared_blocks", [0, 2, 3])  # no hit, a partial hit, every full block (3 of 3.5)
def test_handoff_decode_side_prefix_hit_loads_only_missing_blocks(pair, byte_tok, shared_blocks):
    model, prefill, decode = pair
    base = random_prompts([28], seed=1)[0]
    other = base[:shared_blocks * BLOCK] + random_prompts([28 - shared_blocks * BLOCK], seed=2)[0]
    disaggregated(prefill, decode, [base], [greedy(3)])  # leaves base's full blocks in decode's cache
    outs, (rid,) = disaggregated(prefill, decode, [other], [greedy(6)])
    assert origin(decode, rid) == {"source": "remote", "hit_blocks": shared_blocks, "loaded_blocks": 4 - shared_blocks}
    assert_same_as_unified(model, byte_tok, decode, outs, [other], [greedy(6)])


def test_handoff_aligned_prompt_fully_cached_needs_no_transfer(pair, byte_tok):
    model, prefill, decode = pair
    prompt = random_prompts([16], seed=4)[0]
    disaggregated(prefill, decode, [prompt], [greedy(2)])
    outs, (rid,) = disaggregated(prefill, decode, [prompt], [greedy(5)])
    assert origin(decode, rid) == {"source": "remote", "hit_blocks": 2, "loaded_blocks": 0}
    assert_same_as_unified(model, byte_tok, decode, outs, [prompt], [greedy(5)])


def prompt_kv(engine, rid_or_table, n):
    """The K/V of a sequence's first n positions, read through its block table: [layers, n, kv, d]."""
    table = torch.tensor(rid_or_table)
    k = engine.cache.k[:, table].flatten(1, 2)[:, :n]
    v = engine.cache.v[:, table].flatten(1, 2)[:, :n]
    return k, v


def test_handoff_kv_received_equals_kv_computed_bitwise(pair):
    _, prefill, decode = pair
    prompt = random_prompts([19], seed=5)[0]
    (transfer,) = run_prefill(prefill, [prompt], [greedy(3)])
    sent = prompt_kv(prefill, prefill.held_blocks(transfer["transfer_id"]), 19)
    decode.blocks.allocate(-1, list(range(5 * BLOCK)))  # so the consumer's block ids differ from the producer's
    rid = decode.add_transferred_request(prompt, greedy(3), transfer)
    decode.service_kv()  # the load completes and the request joins the scheduler
    assert decode.blocks.tables[rid][:3] != prefill.held_blocks(transfer["transfer_id"])
    got = prompt_kv(decode, decode.blocks.tables[rid], 19)
    assert torch.equal(sent[0], got[0]) and torch.equal(sent[1], got[1])
    decode.blocks.free(-1)
    while decode.has_unfinished():
        decode.step()
    prefill.service_kv()


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_a_quantized_pool_hands_over_its_codes_and_scales(tmp_path, byte_tok, kv_cache_dtype):
    """Both workers store int8 (or fp8) K/V: the blocks travel as codes and scales, bitwise, and the
    decode side computes what a unified engine with the same pool computes."""
    model = tiny_model("mqa_odd_heads")
    config = EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=32,
                          kv_cache_dtype=kv_cache_dtype)
    prefill, decode = (DisaggEngine(model, byte_tok, config, connector=SharedStorageConnector(tmp_path),
                                    disagg=DisaggConfig(lease_s=60)) for _ in range(2))
    prompts, params = random_prompts([19, 26], seed=7), [greedy(6)] * 2
    transfers = run_prefill(prefill, prompts, params)
    sent = [[t[:, prefill.held_blocks(x["transfer_id"])] for t in prefill.cache.tensors()] for x in transfers]
    ids = [decode.add_transferred_request(p, sp, t) for p, sp, t in zip(prompts, params, transfers)]
    decode.service_kv()  # the loads complete: the blocks are in the consumer's pool
    for rid, prompt, blocks in zip(ids, prompts, sent):
        table = decode.blocks.tables[rid][:len(prompt) // BLOCK]  # the full blocks: nothing decodes into them
        got = [t[:, table] for t in decode.cache.tensors()]
        assert len(got) == 4 and all(torch.equal(a[:, :len(table)], b) for a, b in zip(blocks, got))
    step_to_end(decode, ids)
    decode.service_kv()
    prefill.service_kv()
    unified_engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK,
                                                             kv_cache_dtype=kv_cache_dtype))
    want = unified_engine.generate(prompts, params)
    assert [decode.requests[i].seq.output_ids for i in ids] == [w.token_ids for w in want]
    assert all(decode.kv_origin[i]["source"] == "remote" for i in ids)


def test_workers_with_different_kv_dtypes_recompute_rather_than_misread(tmp_path, byte_tok):
    """A transfer between an int8 pool and a float32 one is refused by its layout: the consumer
    computes the prompt itself."""
    model = tiny_model("mqa_odd_heads")
    make = lambda kv: DisaggEngine(model, byte_tok, EngineConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK,  # noqa: E731
                                                                   kv_cache_dtype=kv),
                                   connector=SharedStorageConnector(tmp_path), disagg=DisaggConfig(lease_s=60))
    prefill, decode = make("int8"), make("auto")
    prompts = random_prompts([19], seed=8)
    outs, (rid,) = disaggregated(prefill, decode, prompts, [greedy(4)])
    assert decode.kv_origin[rid]["source"] == "recomputed"
    assert_same_as_unified(model, byte_tok, decode, outs, prompts, [greedy(4)])


def test_lease_confirm_frees_producer_blocks(pair):
    _, prefill, decode = pair
    (transfer,) = run_prefill(prefill, random_prompts([20]), [greedy(2)])
    held = prefill.held_blocks(transfer["transfer_id"])
    assert len(held) == 3 and all(prefill.blocks.blocks[b].ref_count == 1 for b in held)
    run_decode(decode, random_prompts([20]), [greedy(2)], [transfer])
    prefill.service_kv()
    assert prefill.released == {"confirm": 1} and prefill.kv_stats()["ref_count_sum"] == 0


def test_lease_expiry_frees_producer_blocks(pair):
    _, prefill, _ = pair
    run_prefill(prefill, random_prompts([20, 5]), [greedy(2)] * 2)
    prefill.service_kv(now=time.time())
    assert len(prefill.leases) == 2  # not yet
    prefill.service_kv(now=time.time() + 61)  # no consumer ever came
    assert prefill.released == {"expiry": 2} and prefill.kv_stats()["ref_count_sum"] == 0


def test_cancel_frees_at_once_while_held_and_while_prefilling(pair):
    _, prefill, _ = pair
    (transfer,) = run_prefill(prefill, random_prompts([20]), [greedy(2)])
    assert prefill.cancel(transfer["transfer_id"])
    assert not prefill.leases and prefill.kv_stats()["ref_count_sum"] == 0
    rid = prefill.add_prefill_request(random_prompts([60])[0], greedy(2), transfer_id="t2")
    prefill.step()  # one chunk of 32 tokens: still prefilling
    assert not prefill.requests[rid].finished and prefill.blocks.tables[rid]
    assert prefill.cancel("t2") and not prefill.cancel("t2")
    assert prefill.released == {"cancel": 2} and not prefill.has_unfinished()


def test_lost_kv_is_recomputed_with_the_same_output(pair, byte_tok, tmp_path):
    model, prefill, decode = pair
    prompts = random_prompts([26], seed=6)
    (transfer,) = run_prefill(prefill, prompts, [greedy(6)])
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()  # the storage lost them
    outs, (rid,) = run_decode(decode, prompts, [greedy(6)], [transfer])
    assert decode.kv_origin[rid]["source"] == "recomputed"
    assert_same_as_unified(model, byte_tok, decode, outs, prompts, [greedy(6)])
    prefill.service_kv()
    assert prefill.released == {"confirm": 1}  # the consumer said "done" even though it gave up


def test_load_past_its_deadline_is_recomputed(pair, byte_tok):
    """No request waits forever for K/V: a load that never finishes is given up at its deadline."""
    model, prefill, decode = pair
    never = Future()  # a transfer that hangs: the producer went silent
    decode.connector.start_load = lambda *args: never
    prompts = random_prompts([15], seed=7)
    (transfer,) = run_prefill(prefill, prompts, [greedy(4)])
    rid = decode.add_transferred_request(prompts[0], greedy(4), transfer)
    decode.service_kv()
    assert rid in decode.loading  # still waiting, within its deadline
    decode.service_kv(now=time.time() + 3600)
    assert decode.kv_origin[rid]["source"] == "recomputed" and not decode.loading
    decode.last_logprobs = step_to_end(decode, [rid])
    outs = [decode.requests[rid].seq.output()]
    assert_same_as_unified(model, byte_tok, decode, outs, prompts, [greedy(4)])
    prefill.service_kv()
    assert prefill.released == {"confirm": 1}


def test_export_failure_fails_the_request_and_frees_its_blocks(pair):
    _, prefill, _ = pair

    def broken(*args):
        raise OSError("disk full")
    prefill.connector.save_kv = broken
    rid = prefill.add_prefill_request(random_prompts([12])[0], greedy(3), transfer_id="t")
    outputs = []
    while prefill.has_unfinished():
        outputs += prefill.step()
    assert [type(o.error).__name__ for o in outputs] == ["OSError"] and prefill.requests[rid].finish_reason == "error"
    assert not prefill.leases and rid not in prefill.exports  # the fixture checks the pool is whole


def test_transfer_ids_are_not_reused(pair):
    _, prefill, _ = pair
    prefill.add_prefill_request([1, 2, 3], greedy(2), transfer_id="same")
    with pytest.raises(ValueError, match="already in use"):
        prefill.add_prefill_request([4, 5], greedy(2), transfer_id="same")
    assert prefill.cancel("same")
