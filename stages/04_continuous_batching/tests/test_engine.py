"""Continuous batching changes when tokens are computed, never what they are."""
import pytest
import torch

from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.kv_cache import CacheCapacityError
from course.s03_paged.block_manager import NoFreeBlocksError
from course.s03_paged.engine import PagedGenerator
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine, QueueFullError

PROMPT_LENS = [3, 70, 17, 41, 1, 33]
OUTPUT_LENS = [30, 4, 22, 9, 15, 1]


def prompts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def alone(model, tok, prompt, params):
    return run_to_end(PagedGenerator(model, num_blocks=64, block_size=16), model, tok, prompt, params).token_ids


# scheduling is the point here, not the architecture (stages 01-03 run every tiny config):
# grouped and single K/V heads are enough to catch a ragged batch laid out wrong
@pytest.mark.parametrize("name", ["gqa_tied", "mqa_odd_heads"])
@pytest.mark.parametrize("budget", [5, 13, 64])  # chunks that split prompts mid-block (block 4)
def test_batching_greedy_equals_each_request_alone(name, byte_tok, budget):
    model = tiny_model(name)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=budget))
    params = [greedy(n) for n in OUTPUT_LENS]
    outs = engine.generate(prompts(), params)
    for p, sp, out in zip(prompts(), params, outs):
        assert out.token_ids == alone(model, byte_tok, p, sp), (name, budget)
    assert engine.blocks.num_free_blocks == 64  # the pool is whole again


def test_batching_preemption_keeps_outputs_identical(byte_tok):
    model = tiny_model("mqa_odd_heads")
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=20, block_size=4, max_num_batched_tokens=32))
    params = [greedy(n) for n in OUTPUT_LENS]
    outs = engine.generate(prompts(1), params)
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    for p, sp, out in zip(prompts(1), params, outs):
        assert out.token_ids == alone(model, byte_tok, p, sp)
    assert engine.blocks.num_free_blocks == 20


def test_batching_seeded_sampling_independent_of_neighbours(byte_tok):
    model = tiny_model("gqa_tied")
    target = prompts(2)[2]
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=42, ignore_eos=True)
    by_itself = LLMEngine(model, byte_tok).generate([target], params)[0].token_ids
    crowd = prompts(3)
    others = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in range(len(crowd))]
    engine = LLMEngine(model, byte_tok, EngineConfig(max_num_batched_tokens=16))
    outs = engine.generate(crowd[:3] + [target] + crowd[3:], others[:3] + [params] + others[3:])
    assert outs[3].token_ids == by_itself
    assert by_itself == run_to_end(PagedGenerator(model, 64), model, byte_tok, target, params).token_ids


def test_batching_seeded_sampling_independent_of_unseeded_neighbours(byte_tok):
    """Unseeded neighbours draw their noise from the engine's shared generator, all in one call
    a step; the seeded requests beside them still get the tokens they get alone."""
    model = tiny_model("gqa_tied")
    seeded = [SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=s, ignore_eos=True) for s in (5, 6)]
    alone = [LLMEngine(model, byte_tok).generate([p], sp)[0].token_ids for p, sp in zip(prompts(2)[:2], seeded)]
    crowd = prompts(4)
    unseeded = [SamplingParams(max_new_tokens=10 + i, temperature=1.2, ignore_eos=True) for i in range(len(crowd))]
    engine = LLMEngine(model, byte_tok, EngineConfig(max_num_batched_tokens=16))
    params = unseeded[:2] + seeded[:1] + unseeded[2:5] + seeded[1:] + unseeded[5:]
    outs = engine.generate(crowd[:2] + prompts(2)[:1] + crowd[2:5] + prompts(2)[1:2] + crowd[5:], params)
    assert [outs[2].token_ids, outs[6].token_ids] == alone
    assert all(engine.requests[r].seq.sampler._generator is None for r, sp in enumerate(params) if sp.seed is None)


def test_batching_abort_frees_blocks_at_once(byte_tok):
    model = tiny_model("gqa_tied")
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=40, block_size=4))
    ids = [engine.add_request(p, greedy(50)) for p in prompts()[:3]]
    engine.step(), engine.step()
    held = len(engine.blocks.tables[ids[1]])
    free_before = engine.blocks.num_free_blocks
    engine.abort(ids[1])
    assert ids[1] not in engine.blocks.tables
    assert engine.blocks.num_free_blocks == free_before + held
    assert engine.requests[ids[1]].finish_reason == "abort"
    while engine.has_unfinished():
        engine.step()
    assert engine.blocks.num_free_blocks == 40 and not engine.blocks.tables


def test_batching_one_failing_request_fails_alone(byte_tok):
    """A request whose sampling raises (here a broken logits processor) ends with "error" and
    its blocks freed; the requests batched beside it finish exactly as they would alone."""
    model = tiny_model("gqa_tied")

    def broken(output_ids, logits):
        if len(output_ids) == 3:
            raise RuntimeError("processor bug")
        return logits
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=4))
    bad_params = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True, logits_processors=[broken])
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts()[:3], [greedy(12), bad_params, greedy(9)])]
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    failed = [o for o in outputs if o.error is not None]
    assert [o.request_id for o in failed] == [ids[1]] and "processor bug" in str(failed[0].error)
    assert engine.requests[ids[1]].finish_reason == "error"
    for rid, prompt, n in ((ids[0], prompts()[0], 12), (ids[2], prompts()[2], 9)):
        assert engine.requests[rid].seq.output_ids == alone(model, byte_tok, prompt, greedy(n))
    assert engine.blocks.num_free_blocks == 64 and not engine.blocks.tables
    with pytest.raises(RuntimeError, match="processor bug"):  # offline generate() reports it
        LLMEngine(model, byte_tok).generate([prompts()[0]], bad_params)


def test_batching_token_budget_and_chunked_prefill_schedule(byte_tok):
    model = tiny_model("gqa_tied")
    budget = 8
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=budget))
    short = engine.add_request(prompts()[0], greedy(30))  # decoding while the long prompt arrives
    engine.step(), engine.step()
    long_id = engine.add_request(prompts()[1], greedy(3))  # 70 tokens: must be chunked
    while engine.has_unfinished():
        engine.step()
    assert all(sum(n for _, n, _ in s["chunks"]) <= budget for s in engine.step_log)
    long_steps = [s for s in engine.step_log if any(r == long_id and n > 1 for r, n, _ in s["chunks"])]
    assert len(long_steps) >= 70 // budget  # the prompt was split over many steps...
    assert all(any(r == short for r, _, _ in s["chunks"]) for s in long_steps)  # ...and the decode went on


def test_batching_without_chunking_runs_prompts_whole(byte_tok):
    model = tiny_model("gqa_tied")
    engine = LLMEngine(model, byte_tok, EngineConfig(max_num_batched_tokens=80, enable_chunked_prefill=False))
    outs = engine.generate(prompts(), [greedy(n) for n in OUTPUT_LENS])
    for s in engine.step_log:
        for rid, n, computed in s["chunks"]:
            assert n == 1 or computed + n == len(prompts()[rid])  # a decode, or a whole prompt
    assert [len(o.token_ids) for o in outs] == OUTPUT_LENS


def test_batching_without_chunking_refuses_a_prompt_past_the_budget_and_never_hangs(byte_tok):
    """A prompt no step can hold would wait forever: refused at once. A preempted request whose
    recompute (prompt + output so far) outgrew the budget is recomputed in chunks instead (with
    prefix caching off: cached blocks would otherwise shrink the recompute below the budget)."""
    model = tiny_model("gqa_tied")
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=14, block_size=4, max_num_batched_tokens=21,
                                                     enable_chunked_prefill=False, enable_prefix_caching=False))
    with pytest.raises(ValueError, match="chunked prefill off"):
        engine.add_request(list(range(22)), greedy(4))
    assert not engine.blocks.tables and not engine.scheduler.waiting
    work = [prompts(5)[i][:20] for i in (1, 3, 5)]
    outs = engine.generate(work, [greedy(24)] * 3)  # 20 + 24 tokens each, a 56-token pool: preemptions
    assert engine.scheduler.num_preemptions > 0
    for p, out in zip(work, outs):
        assert out.token_ids == alone(model, byte_tok, p, greedy(24))


def test_batching_max_num_seqs_is_respected(byte_tok):
    engine = LLMEngine(tiny_model("gqa_tied"), byte_tok, EngineConfig(max_num_seqs=2))
    for p in prompts():
        engine.add_request(p, greedy(5))
    while engine.has_unfinished():
        engine.step()
        assert len(engine.scheduler.running) <= 2


def test_batching_admission_control(byte_tok):
    engine = LLMEngine(tiny_model("gqa_tied"), byte_tok, EngineConfig(num_blocks=8, block_size=4, max_waiting=2))
    with pytest.raises(NoFreeBlocksError, match="the pool has 8"):
        engine.add_request(list(range(30)), greedy(10))
    with pytest.raises(CacheCapacityError, match="maximum sequence length of 512"):
        engine.add_request(list(range(500)), greedy(100))
    engine.add_request([1, 2], greedy(2)), engine.add_request([3, 4], greedy(2))
    with pytest.raises(QueueFullError, match="queue is full"):
        engine.add_request([5, 6], greedy(2))
    assert not engine.blocks.tables  # refusals allocated nothing


@pytest.mark.slow
def test_batching_real_model_equals_alone(smollm2):
    from course.s01_decode_loop.generate import encode_prompt

    tok, model = smollm2.tokenizer, smollm2.model
    questions = ["Explain in two sentences why the sky is blue.", "Hi"]  # a long and a short prompt, one batch
    ps = [encode_prompt(tok, q, chat=True) for q in questions]
    params = SamplingParams(max_new_tokens=16, temperature=0)
    engine = LLMEngine(model, tok, EngineConfig(num_blocks=64, max_num_batched_tokens=48), smollm2.eos_token_ids)
    outs = engine.generate(ps, params)
    for p, out in zip(ps, outs):
        ref = run_to_end(PagedGenerator(model, 64), model, tok, p, params, smollm2.eos_token_ids)
        assert out.token_ids == ref.token_ids and out.text == ref.text
