"""The per-request switch `add_request(..., speculative=False)`: that request is never drafted for,
while its neighbour in the same batch is, and both keep exactly their greedy tokens."""
from collections import Counter

from course.final.engine import Engine, SpeculativeConfig
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
from course.s05_speculative.drafter import Draft, Drafter
from course.s06_kernels_graphs.engine import KernelEngineConfig

DRAFTED, PLAIN = b"abcabcabcabc", b"the cat sat on the mat"
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
# a budget wide enough that drafts are never trimmed: a request's drafts cannot depend on its neighbour
CONFIG = dict(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)


class CountingOracle(Drafter):
    """Proposes each request's true continuation (every draft accepted), counting calls per prompt."""

    def __init__(self, truth: dict[bytes, list[int]]):
        self.truth, self.calls = truth, Counter()

    def propose(self, seq, k):
        prompt = bytes(seq.prompt_ids)
        self.calls[prompt] += 1
        return Draft(self.truth[prompt][len(seq.output_ids):][:k])


def greedy_truth(model, tok) -> dict[bytes, list[int]]:
    engine = BatchingEngine(model, tok, EngineConfig(**CONFIG), [TINY_EOS])
    return dict(zip((DRAFTED, PLAIN), (o.token_ids for o in engine.generate([list(DRAFTED), list(PLAIN)], GREEDY))))


def run(model, tok, truth, requests: list[tuple[bytes, bool]]):
    """Run (prompt, speculative) requests together: their outputs, the engine, the drafter, and
    how many tokens each request emitted in each step."""
    drafter = CountingOracle(truth)
    engine = Engine(model, tok, KernelEngineConfig(**CONFIG), [TINY_EOS], SpeculativeConfig("lookup", 4), drafter=drafter)
    ids = [engine.add_request(list(prompt), GREEDY, speculative=on) for prompt, on in requests]
    steps = []
    while engine.has_unfinished():
        before = [len(engine.requests[r].seq.output_ids) for r in ids]
        engine.step()
        steps.append([len(engine.requests[r].seq.output_ids) - b for r, b in zip(ids, before)])
    return [engine.requests[r].seq.output_ids for r in ids], engine, drafter, steps


def test_a_request_with_speculation_off_is_never_drafted_for_beside_a_drafted_one(byte_tok):
    model = tiny_model("gqa_tied")
    truth = greedy_truth(model, byte_tok)
    got, engine, drafter, steps = run(model, byte_tok, truth, [(DRAFTED, True), (PLAIN, False)])
    assert got == [truth[DRAFTED], truth[PLAIN]]  # both keep their exact greedy tokens
    assert drafter.calls[PLAIN] == 0 and drafter.calls[DRAFTED] > 0
    assert all(plain <= 1 for _, plain in steps)  # one token a step: plain decoding
    assert any(drafted > 1 and plain == 1 for drafted, plain in steps)  # in the same step as accepted drafts
    # the spec counters hold the drafted request's verifications and nothing of the other's
    _, alone, _, _ = run(model, byte_tok, truth, [(DRAFTED, True)])
    assert engine.spec_stats == alone.spec_stats and engine.accepted_per_position == alone.accepted_per_position
    assert not engine.drafts  # nothing of either request is left in the drafter's step state


def test_the_same_pair_both_speculated_drafts_for_both(byte_tok):
    """The control: without the switch the second request is drafted for and counted, so the
    test above could fail."""
    model = tiny_model("gqa_tied")
    truth = greedy_truth(model, byte_tok)
    got, engine, drafter, steps = run(model, byte_tok, truth, [(DRAFTED, True), (PLAIN, True)])
    _, alone, _, _ = run(model, byte_tok, truth, [(DRAFTED, True)])
    assert got == [truth[DRAFTED], truth[PLAIN]]
    assert drafter.calls[PLAIN] > 0 and any(plain > 1 for _, plain in steps)
    assert engine.spec_stats.target_forwards > alone.spec_stats.target_forwards


def test_an_aborted_opted_out_request_leaves_no_trace(byte_tok):
    model = tiny_model("gqa_tied")
    engine = Engine(model, byte_tok, KernelEngineConfig(**CONFIG), [TINY_EOS], SpeculativeConfig("lookup", 4))
    rid = engine.add_request(list(PLAIN), GREEDY, speculative=False)
    engine.step()
    assert engine.requests[rid].speculative is False  # the switch rides on the request itself
    engine.abort(rid)
    engine.step()
    engine.forget(rid)
    assert rid not in engine.requests and rid not in engine.drafts
