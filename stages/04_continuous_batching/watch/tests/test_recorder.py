"""The step recorder's snapshots say what the pool really holds, step by step."""
import torch

from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.engine import PagedGenerator
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.watch.recorder import CACHED, FREE, SHARED, StepRecorder

PROMPT_LENS = [3, 70, 17, 41, 1, 33]
OUTPUT_LENS = [30, 4, 22, 9, 15, 1]


def recorded_run(model, tok, num_blocks, prefix_caching=True, shared_prefix=()):
    g = torch.Generator().manual_seed(1)
    prompts = [list(shared_prefix) + torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]
    params = [SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True) for n in OUTPUT_LENS]
    engine = LLMEngine(model, tok, EngineConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=32,
                                                enable_prefix_caching=prefix_caching))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    recorder = StepRecorder(engine)
    return engine, recorder.run(), prompts, params, ids


def test_recorder_pool_accounting_holds_at_every_step(byte_tok):
    model = tiny_model("gqa_tied")
    for caching in (False, True):  # with caching, every prompt starts with the same two blocks
        engine, snaps, *_ = recorded_run(model, byte_tok, num_blocks=24, prefix_caching=caching,
                                         shared_prefix=range(100, 108))
        assert snaps and [s.step for s in snaps] == list(range(len(snaps)))
        for s in snaps:
            held = {b for table in s.tables.values() for b in table}
            assert s.used_blocks == len(held)
            owners = s.pool_owners()
            assert {b for b, o in enumerate(owners) if o >= 0 or o == SHARED} == held
            assert owners.count(CACHED) == len(s.cached) and owners.count(FREE) == s.empty_blocks
            held_twice = sum(len(t) for t in s.tables.values()) - len(held)
            assert (owners.count(SHARED) > 0) == (held_twice > 0) and owners.count(SHARED) <= held_twice
            if not caching:  # no sharing: every used block belongs to exactly one table
                assert s.used_blocks == sum(len(t) for t in s.tables.values()) and not s.cached
            assert sum(n for _, n in s.chunks) <= 32
        assert snaps[-1].tables == {} and snaps[-1].used_blocks == 0
        assert any(SHARED in s.pool_owners() for s in snaps) == caching


def test_recorder_preempted_request_frees_its_blocks_that_step_and_resumes_unchanged(byte_tok):
    model = tiny_model("mqa_odd_heads")
    engine, snaps, prompts, params, ids = recorded_run(model, byte_tok, num_blocks=20)
    preemptions = [(s, rid) for s in snaps for rid in s.preempted]
    assert preemptions, "the pool was meant to be too small"
    for s, rid in preemptions:
        assert s.step > 0 and rid in snaps[s.step - 1].tables, "it held blocks the step before"
        assert rid not in s.tables and rid in s.waiting, "its blocks are freed the step it is preempted"
        assert rid not in [r for r, _ in s.chunks], "and it runs nothing that step"
        assert any(rid in [r for r, _ in t.chunks] for t in snaps[s.step + 1:]), "it runs again later"
    for rid, p, sp in zip(ids, prompts, params):
        out = engine.requests[rid].seq.output().token_ids
        assert out == run_to_end(PagedGenerator(model, num_blocks=64, block_size=16), model, byte_tok, p, sp).token_ids
