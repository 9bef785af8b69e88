"""Overlap scheduling (overlap/) gives the synchronous engine's tokens, token for token.

The workloads reuse test_engine.py's: chunked prefill beside decodes, prefix-cache hits, and a
tight pool that preempts. Requests also finish mid-batch (EOS, different lengths), are aborted
with a step in flight, arrive while one is in flight, and ask for what the device cannot draw
alone (logprobs), which must fall back to the synchronous step."""
import pytest

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import tiny_model
from course.s06_kernels_graphs import gpu, overlap
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

from .test_engine import GREEDY, PROMPTS, stage04, stage06

overlap.register()  # the `overlap` option
gpu.register()  # the blocked experts of captured MoE steps

SEEDED = [SamplingParams(max_new_tokens=8 + i, temperature=0.9, top_p=0.95, seed=100 + i) for i in range(len(PROMPTS))]
UNEVEN = [SamplingParams(max_new_tokens=3 + 2 * i, temperature=0.0) for i in range(len(PROMPTS))]  # EOS allowed


@pytest.mark.parametrize("name, pool, graphs", [("gqa_tied", "tight", False), ("mixtral_moe", "roomy", True)],
                         ids=["gqa_tied-eager-tight", "mixtral_moe-graphs-roomy"])
def test_overlap_gives_stage04_greedy_tokens(byte_tok, name, pool, graphs):
    model = tiny_model(name)
    want = stage04(model, byte_tok, GREEDY, pool)
    got, engine = stage06(model, byte_tok, GREEDY, pool, cuda_graphs=graphs, fused=True, overlap=True)
    assert got == want
    assert engine.stats()["overlapped_steps"] > 0  # steps really ran ahead of their reads
    assert engine.stats()["free_blocks"] == engine.blocks.num_blocks  # every block came back


@pytest.mark.parametrize("params", [SEEDED, UNEVEN], ids=["seeded", "uneven-lengths"])
def test_overlap_equals_the_synchronous_engine(byte_tok, params):
    model = tiny_model("gqa_tied")
    want, _ = stage06(model, byte_tok, params, "tight", fused=True)
    got, engine = stage06(model, byte_tok, params, "tight", fused=True, overlap=True)
    assert got == want
    assert engine.stats()["overlapped_steps"] > 0


def test_logprobs_fall_back_to_the_synchronous_step(byte_tok):
    model = tiny_model("gqa_tied")
    params = [SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)] * len(PROMPTS)
    want, _ = stage06(model, byte_tok, params, "roomy")
    got, engine = stage06(model, byte_tok, params, "roomy", overlap=True)
    assert got == want
    assert engine.stats()["overlapped_steps"] == 0


def _engine(model, tok, **options):
    config = KernelEngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, num_blocks=64, **options)
    return LLMEngine(model, tok, config)


def test_abort_and_arrival_with_a_step_in_flight(byte_tok):
    """One request is aborted and another arrives while a step is in flight: the others'
    tokens are what they get without either, and every block comes back."""
    model = tiny_model("gqa_tied")
    prompts = [list(p) for p in PROMPTS[:3]]
    alone = [o.token_ids for o in _engine(model, byte_tok).generate(prompts, GREEDY)]
    late = _engine(model, byte_tok).generate([list(PROMPTS[3])], GREEDY)[0].token_ids

    engine = _engine(model, byte_tok, overlap=True)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    victim = engine.add_request(list(PROMPTS[4]), GREEDY)
    while not engine.extensions["overlap"].in_flight():
        engine.step()
    engine.abort(victim)
    newcomer = engine.add_request(list(PROMPTS[3]), GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert [engine.requests[i].seq.output_ids for i in ids] == alone
    assert engine.requests[newcomer].seq.output_ids == late
    assert engine.requests[victim].finish_reason == "abort"
    assert engine.stats()["free_blocks"] == engine.blocks.num_blocks


def test_a_reserved_place_is_filled_by_the_next_append(byte_tok):
    seq = Sequence([1, 2], SamplingParams(max_new_tokens=4), byte_tok)
    seq.reserve()
    assert seq.all_ids == [1, 2, -1]  # the engine's count sees the token in flight
    seq.append(7)
    seq.append(8)
    assert seq.all_ids == [1, 2, 7, 8] and seq.output_ids == [7, 8]
