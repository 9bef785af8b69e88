"""Speculative decoding keeps the target's output: greedy token for token, sampled in distribution."""
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import TINY_CONFIGS, tiny_model
from course.s02_kv_cache.generate import forward_step, generate_cached, reserve_cache
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache
from course.s05_speculative.draft_model import DraftModelDrafter, truncated_model
from course.s05_speculative.drafter import Draft, Drafter
from course.s05_speculative.prompt_lookup import PromptLookupDrafter, lookup
from course.s05_speculative.speculative import SpecStats, stream_speculative

PROMPT = [72, 101, 108, 108, 111, 32, 72, 101, 108, 108, 111]  # "Hello Hello": lookup finds matches


class Oracle(Drafter):
    """Proposes the reference continuation (every draft right), or shifted by one (every draft wrong)."""
    name = "oracle"

    def __init__(self, reference: list[int], vocab: int, wrong: bool = False):
        self.reference, self.vocab, self.wrong = reference, vocab, wrong

    def propose(self, seq, k):
        upcoming = self.reference[len(seq.output_ids):len(seq.output_ids) + k]
        return Draft([(t + 1) % self.vocab if self.wrong else t for t in upcoming])


def reference(model, tok, params, prompt=PROMPT):
    return generate_cached(model, tok, prompt, params, [tok.eos_token_id])


def speculate(model, tok, params, drafter, k, prompt=PROMPT, cache=None):
    seq, stats = Sequence(prompt, params, tok, [tok.eos_token_id]), SpecStats()
    list(stream_speculative(model, seq, drafter, k, stats=stats, cache=cache))
    return seq.output(), stats


def drafters(model, ref_ids):
    vocab = model.config.vocab_size
    return {"lookup": PromptLookupDrafter(), "draft1": DraftModelDrafter(truncated_model(model, 1)),
            "right": Oracle(ref_ids, vocab), "wrong": Oracle(ref_ids, vocab, wrong=True)}


# every k on one architecture, every architecture at k = 3: the two vary independently
K_CASES = [("mha_untied", k) for k in (0, 1, 2, 6)] + [(name, 3) for name in sorted(TINY_CONFIGS)]


@pytest.mark.parametrize("config,k", K_CASES)
def test_speculative_greedy_equals_stage02_for_every_drafter(config, byte_tok, k):
    model = tiny_model(config)
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    ref = reference(model, byte_tok, params)
    for name, drafter in drafters(model, ref.token_ids).items():
        out, stats = speculate(model, byte_tok, params, drafter, k)
        assert out.token_ids == ref.token_ids, name
        assert out.text == ref.text, name
        if k and name == "right":
            assert stats.accepted == stats.proposed > 0  # all right: every draft kept
        if name == "wrong" or k == 0:
            assert stats.accepted == 0 and stats.emitted == stats.target_forwards


def test_speculative_greedy_with_penalties_equals_stage02(byte_tok):
    """Penalties depend on the tokens before each position: verification must count the drafts."""
    model = tiny_model("mha_untied")
    params = SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True, repetition_penalty=1.3,
                            frequency_penalty=0.5)
    ref = reference(model, byte_tok, params)
    for name, drafter in drafters(model, ref.token_ids).items():
        assert speculate(model, byte_tok, params, drafter, 4)[0].token_ids == ref.token_ids, name


def test_speculative_stops_inside_an_accepted_run(byte_tok):
    """A stop token or stop string in the middle of an accepted run ends the output there."""
    model = tiny_model("mha_untied")
    free = reference(model, byte_tok, SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True))
    ids, text = free.token_ids, free.text
    stop_token = next(t for i, t in enumerate(ids) if i >= 4 and t not in ids[:i])  # first seen late
    stop_string = next(text[i:i + 2] for i in range(4, len(text)) if text[i:i + 2] not in text[:i + 1])
    for params in (SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=[stop_token]),
                   SamplingParams(max_new_tokens=24, temperature=0, stop=[stop_string])):
        ref = reference(model, byte_tok, params)
        assert len(ref.token_ids) < 24  # the stop really fires early
        out, stats = speculate(model, byte_tok, params, Oracle(free.token_ids, 258), 6)
        assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, "stop")
        assert stats.accepted > 0


def test_speculative_respects_max_new_tokens_exactly(byte_tok):
    model = tiny_model("mha_untied")
    for n in (1, 2, 5, 7):
        params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
        ref = reference(model, byte_tok, params)
        out, _ = speculate(model, byte_tok, params, Oracle(ref.token_ids + [1] * 10, 258), 6)
        assert out.token_ids == ref.token_ids and len(out.token_ids) == n


def test_cache_after_rollbacks_equals_a_run_that_never_drafted(byte_tok):
    model = tiny_model("mha_untied")
    params = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True)
    ref = reference(model, byte_tok, params)
    seq = Sequence(PROMPT, params, byte_tok)
    cache = reserve_cache(model, seq)
    out, stats = speculate(model, byte_tok, params, Oracle(ref.token_ids, 258, wrong=True), 3, cache=cache)
    assert stats.proposed > 0  # there were rejections to roll back
    plain = KVCache(model.config, cache.capacity)
    forward_step(model, ContiguousKVAttention(plain), PROMPT + out.token_ids[:-1])
    n = plain.num_tokens
    assert cache.num_tokens == n == len(PROMPT) + len(out.token_ids) - 1
    torch.testing.assert_close(cache.k[:, :n], plain.k[:, :n], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[:, :n], plain.v[:, :n], atol=1e-5, rtol=1e-4)


def test_sampled_speculation_is_seeded_and_changes_with_the_seed(byte_tok):
    model = tiny_model("mha_untied")
    draft = DraftModelDrafter(truncated_model(model, 1))
    runs = [speculate(model, byte_tok, SamplingParams(max_new_tokens=16, temperature=1.0, seed=s, ignore_eos=True),
                      draft, 3)[0].token_ids for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_prompt_lookup_finds_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2], k=2) == [3, 9]
    assert lookup([1, 2, 3, 1, 2, 4, 1, 2], k=3) == [4, 1, 2]      # latest earlier match of [1, 2]
    assert lookup([5, 6, 7, 8], k=3) == []                            # nothing repeats
    assert lookup([7, 1, 2, 3, 4, 2, 3], k=2, max_ngram=2) == [4, 2]  # 2-gram [2, 3] beats 1-gram [3]
    assert lookup([1, 2, 1], k=5) == [2, 1]                           # fewer than k left: what there is


def test_truncated_draft_shares_the_targets_weights(byte_tok):
    model = tiny_model("mha_untied")
    full = truncated_model(model, model.config.num_hidden_layers)
    assert full.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    seq = Sequence(PROMPT, SamplingParams(), byte_tok)
    a = forward_step(model, ContiguousKVAttention(reserve_cache(model, seq)), PROMPT)
    b = forward_step(full, ContiguousKVAttention(reserve_cache(full, seq)), PROMPT)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="num_layers"):
        truncated_model(model, 0)


class TokenHistoryFilter:
    """A stateful logits processor, like a grammar: it allows only tokens greater than the last
    one it was shown (mod 200), and it must be shown every output it masks for, in order."""

    def __call__(self, output_ids, logits):
        last = output_ids[-1] if output_ids else 0
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        allowed[(last % 200) + 1:] = True
        return logits.masked_fill(~allowed, float("-inf"))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_speculation_applies_logits_processors_and_never_accepts_a_forbidden_draft(byte_tok, temperature):
    """Drafts the processor forbids are proposed on purpose; verification must reject each one
    and emit what the processed target emits (stage 02's loop with the same processor)."""
    model = tiny_model("gqa_tied")
    params = SamplingParams(max_new_tokens=20, temperature=temperature, seed=3, ignore_eos=True,
                            logits_processors=[TokenHistoryFilter()])
    ref = reference(model, byte_tok, params)
    for wrong in (False, True):  # right drafts are allowed; each wrong one is a token the filter forbids
        drafter = Oracle([0 if wrong else t for t in ref.token_ids], model.config.vocab_size)
        out, stats = speculate(model, byte_tok, params, drafter, 4)
        assert all(b > a % 200 for a, b in zip(out.token_ids, out.token_ids[1:]))  # the processor held
        if temperature == 0:
            assert out.token_ids == ref.token_ids
        if wrong:
            assert stats.accepted == 0 and stats.proposed > 0


def test_tree_speculation_refuses_logits_processors(byte_tok):
    from course.s05_speculative.speculative import stream_tree_speculative
    seq = Sequence(PROMPT, SamplingParams(max_new_tokens=4, temperature=0, logits_processors=[TokenHistoryFilter()]),
                   byte_tok, [byte_tok.eos_token_id])
    with pytest.raises(ValueError, match="logits processors"):
        list(stream_tree_speculative(tiny_model("gqa_tied"), seq, drafter=None))


def test_benchmark_tells_a_near_tie_from_a_real_difference():
    """The benchmark's equality check: a flip between two tokens whose reference logits are
    within the tolerance is a near tie (rounding), anything else differs."""
    from course.s01_decode_loop.generate import next_token_logits
    from course.s05_speculative.bench.benchmark import compare

    model, prompt = tiny_model("gqa_tied"), [5, 9, 2, 7]
    want = [int(next_token_logits(model, prompt).argmax())]
    logits = next_token_logits(model, prompt)
    runner_up = int(logits.topk(2).indices[1])
    gap = float(logits[want[0]] - logits[runner_up])
    assert compare(model, prompt, want, want) == "equal"
    assert compare(model, prompt, want, [runner_up]) == "differs"  # the tiny model's gap is wide
    assert compare(model, prompt, want, [runner_up], tol=gap * 1.01) == "near tie"
    assert compare(model, prompt, want, want + [3]) == "differs"  # not a token flip: a length change
