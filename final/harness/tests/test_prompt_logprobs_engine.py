"""The engine scores a prompt during its prefill: the same numbers as one full forward, whatever
the step looks like (chunks, graphs, drafting neighbours, preemption, prefix-cache hits)."""
import dataclasses
import math

import pytest
import torch

from course.final.engine import Engine, SpeculativeConfig
from course.final.harness.prompt_logprobs import PromptLogprobs, scored
from course.s01_decode_loop.generate import next_token_logits
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching.policy import Priority
from course.s06_kernels_graphs.engine import KernelEngineConfig


def full_forward_rows(model, ids: list[int], k: int) -> list[tuple[float, list[int]]]:
    """(logprob of token p, the k most likely ids there) for p = 1 .. len(ids) - 1."""
    out = []
    for p in range(1, len(ids)):
        logp = torch.log_softmax(next_token_logits(model, ids[:p]).float(), dim=-1)
        out.append((float(logp[ids[p]]), logp.topk(k).indices.tolist()))
    return out


@pytest.mark.parametrize("graphs", [False, True])
def test_prompt_rows_equal_a_full_forward_under_chunks_preemption_and_drafts(byte_tok, graphs):
    """Four requests over a pool too small for them (preemption), prefill in chunks of 12 rows."""
    model = tiny_model("gqa_tied")
    config = KernelEngineConfig(num_blocks=14, block_size=4, max_num_batched_tokens=12, cuda_graphs=graphs,
                                graph_max_num_tokens=12)
    llm = Engine(model, byte_tok, config, [byte_tok.eos_token_id], SpeculativeConfig("lookup", 2))
    PromptLogprobs(llm)  # what the harness plug-in hooks into the served engine
    prompts = [byte_tok(t).input_ids for t in ("abcabcabcabcabcabc", "the cat and the cat", "xyzxyzxyz xyz")]
    rows = [[] for _ in prompts]
    plain = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    params = [scored(plain, 3, r) for r in rows] + [plain]  # a plain neighbour that drafts
    llm.generate(prompts + [prompts[0]], params)
    assert llm.scheduler.num_preemptions > 0  # 56 slots for four requests of ~30 tokens
    assert llm.graphed_steps > 0 if graphs else llm.graphed_steps == 0
    again = []  # the first prompt once more: its blocks are cached now, yet every row is computed
    llm.generate([prompts[0]], [scored(plain, 3, again)])
    for ids, got in zip(prompts + [prompts[0]], rows + [again]):
        want = full_forward_rows(model, ids, 3)
        assert [r.token_id for r in got] == ids[1:]
        for r, (lp, top) in zip(got, want):
            assert math.isclose(r.logprob, lp, abs_tol=1e-4)
            assert [i for i, _ in r.top] == top and r.rank >= 1
            assert (r.rank == 1) == (r.token_id == top[0])
    assert llm.blocks.num_free_blocks == llm.blocks.num_blocks  # nothing leaked


def test_a_scored_request_that_displaces_a_running_one_skips_the_cache(byte_tok):
    """Under the priority policy a newcomer takes a running request's seat (it leaves the queue
    before its blocks are allocated): its cached prefix is still recomputed and scored."""
    model = tiny_model("gqa_tied")
    config = KernelEngineConfig(num_blocks=32, block_size=4, max_num_seqs=1, max_num_batched_tokens=8)
    llm = Engine(model, byte_tok, config, [byte_tok.eos_token_id], policy=Priority())
    PromptLogprobs(llm)
    ids = byte_tok("a prompt of some twenty tokens").input_ids
    plain = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    llm.generate([ids], plain)  # its blocks are cached now
    llm.add_request(byte_tok("a long low-priority one").input_ids, dataclasses.replace(plain, max_new_tokens=30), 5)
    llm.step()
    rows = []
    rid = llm.add_request(ids, scored(plain, 1, rows), priority=0)
    while llm.has_unfinished():
        llm.step()
    assert llm.requests[rid].finish_reason == "length" and llm.scheduler.num_pauses + llm.scheduler.num_preemptions
    want = full_forward_rows(model, ids, 1)
    assert len(rows) == len(want) and all(math.isclose(r.logprob, lp, abs_tol=1e-4) for r, (lp, _) in zip(rows, want))
