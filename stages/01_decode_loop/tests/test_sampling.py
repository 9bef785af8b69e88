"""Tests for stage 01 sampling: each transform against an independent reference, the
sampler's distribution and seeding, and SamplingParams validation."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from course.s01_decode_loop.sampling import (
    Sampler,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
    apply_min_p,
    apply_presence_frequency_penalty,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    process_logits,
    token_logprobs,
)
from course.s01_decode_loop.sequence import Sequence

NEG_INF = float("-inf")


def rand_logits(seed: int, vocab: int = 50, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, vocab, generator=g) * 3


def softmax_np(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


# --- references, written with Python loops / numpy rather than torch ops ---------------

def ref_repetition(logits, seen, penalty):
    out = list(map(float, logits))
    for i in set(seen):
        out[i] = out[i] / penalty if out[i] > 0 else out[i] * penalty
    return out


def ref_presence_frequency(logits, output_ids, presence, frequency):
    counts = Counter(output_ids)
    return [float(x) - (presence if counts[i] else 0.0) - frequency * counts[i]
            for i, x in enumerate(logits)]


def ref_top_k(logits, k):
    vals = sorted(map(float, logits), reverse=True)
    kth = vals[k - 1]
    return [x if x >= kth else NEG_INF for x in map(float, logits)]


def ref_top_p(logits, p):
    probs = softmax_np(logits)
    keep, total = set(), 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        keep.add(i)
        total += probs[i]
        if total >= p:
            break
    return [float(x) if i in keep else NEG_INF for i, x in enumerate(logits)]


def ref_min_p(logits, min_p):
    probs = softmax_np(logits)
    return [float(x) if probs[i] >= min_p * probs.max() else NEG_INF for i, x in enumerate(logits)]


def assert_same(out: torch.Tensor, ref):
    ref = torch.tensor(ref, dtype=torch.float64)
    assert torch.equal(torch.isinf(out), torch.isinf(ref)), "different tokens filtered"
    finite = torch.isfinite(ref)
    # (torch.allclose, not torch.testing.assert_close: the latter costs ~1 s to import)
    assert torch.allclose(out.double()[finite], ref[finite], rtol=1e-6, atol=1e-6), (out, ref)


# --- transforms against references ------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_reference(seed, penalty):
    logits = rand_logits(seed)
    seen = torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
    assert_same(apply_repetition_penalty(logits, seen, penalty),
                ref_repetition(logits.tolist(), seen, penalty))


def test_repetition_penalty_positive_and_negative_logits():
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0])
    out = apply_repetition_penalty(logits, [0, 1, 1, 1], 2.0)
    # positive divided, negative multiplied: both go down; a token counts once however often seen
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0]
    assert apply_repetition_penalty(logits, [], 2.0).tolist() == logits.tolist()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("presence,frequency", [(0.5, 0.0), (0.0, 0.7), (1.5, -0.3), (-2.0, 2.0)])
def test_presence_frequency_penalty_matches_reference(seed, presence, frequency):
    logits = rand_logits(seed)
    out_ids = torch.randint(0, 10, (30,), generator=torch.Generator().manual_seed(seed)).tolist()
    assert_same(apply_presence_frequency_penalty(logits, out_ids, presence, frequency),
                ref_presence_frequency(logits.tolist(), out_ids, presence, frequency))


def test_presence_frequency_penalty_counts():
    logits = torch.zeros(4)
    out = apply_presence_frequency_penalty(logits, [1, 2, 2, 2], presence=1.0, frequency=0.5)
    assert out.tolist() == [0.0, -1.5, -2.5, 0.0]


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5])
def test_temperature_matches_reference(t):
    logits = rand_logits(0)
    assert_same(apply_temperature(logits, t), [x / t for x in logits.tolist()])
    with pytest.raises(ValueError):
        apply_temperature(logits, 0.0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 3, 10, 49, 50, 80])
def test_top_k_matches_reference(seed, k):
    logits = rand_logits(seed)
    assert_same(apply_top_k(logits, k), ref_top_k(logits.tolist(), min(k, 50)))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_top_k_keeps_all_ties(k):
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0])
    out = apply_top_k(logits, k)
    assert_same(out, ref_top_k(logits.tolist(), k))
    kept = torch.isfinite(out).sum().item()
    assert kept == {1: 2, 2: 2, 3: 5, 4: 5, 5: 5}[k]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("p", [0.01, 0.3, 0.5, 0.9, 0.99])
def test_top_p_matches_reference(seed, p):
    logits = rand_logits(seed)
    assert_same(apply_top_p(logits, p), ref_top_p(logits.tolist(), p))


def test_top_p_exact_boundary_and_tie_order():
    # four equal probs of 0.25 (exact in binary): 0.25 + 0.25 reaches p = 0.5, so two stay,
    # and among equal probabilities the lower ids go first
    out = apply_top_p(torch.zeros(4), 0.5)
    assert torch.isfinite(out).tolist() == [True, True, False, False]


def test_top_p_always_keeps_top_token():
    logits = torch.tensor([0.0, 0.0, 0.1, 0.0])
    out = apply_top_p(logits, 1e-9)
    assert torch.isfinite(out).tolist() == [False, False, True, False]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 1.0])
def test_min_p_matches_reference(seed, min_p):
    logits = rand_logits(seed)
    assert_same(apply_min_p(logits, min_p), ref_min_p(logits.tolist(), min_p))


@pytest.mark.parametrize("fn,arg", [(apply_temperature, 0.7), (apply_top_k, 5),
                                    (apply_top_p, 0.8), (apply_min_p, 0.1)])
def test_filters_work_rowwise_on_batches(fn, arg):
    batch = rand_logits(3, 50, 4)
    out = fn(batch, arg)
    assert out.shape == batch.shape
    for row in range(4):
        assert torch.equal(out[row], fn(batch[row], arg))


@pytest.mark.parametrize("fn,args", [
    (apply_repetition_penalty, ([1, 2, 3], 1.5)),
    (apply_presence_frequency_penalty, ([1, 2, 2], 0.5, 0.5)),
    (apply_temperature, (0.5,)),
    (apply_top_k, (3,)),
    (apply_top_k, (100,)),
    (apply_top_p, (0.5,)),
    (apply_min_p, (0.2,)),
])
def test_transforms_do_not_mutate_input(fn, args):
    logits = rand_logits(7)
    before = logits.clone()
    out = fn(logits, *args)
    assert torch.equal(logits, before)
    out.fill_(0.0)  # a new tensor, not a view of the input
    assert torch.equal(logits, before)


def test_process_logits_does_not_mutate_and_returns_new_tensor():
    logits = rand_logits(8)
    before = logits.clone()
    for params in [SamplingParams(temperature=0), SamplingParams(),
                   SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05,
                                  repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5)]:
        out = process_logits(logits, params, [1, 2], [3, 3])
        out.fill_(0.0)
        assert torch.equal(logits, before)


def test_process_logits_order_matches_manual_chain():
    logits = rand_logits(9)
    prompt, output = [1, 2, 3], [3, 4, 4, 5]
    p = SamplingParams(temperature=0.7, top_k=10, top_p=0.8, min_p=0.05,
                       repetition_penalty=1.2, presence_penalty=0.4, frequency_penalty=0.3)
    x = ref_repetition(logits.tolist(), prompt + output, 1.2)
    x = ref_presence_frequency(x, output, 0.4, 0.3)
    x = [v / 0.7 for v in x]
    x = ref_top_k(x, 10)
    x = ref_top_p(x, 0.8)
    x = ref_min_p(x, 0.05)
    assert_same(process_logits(logits, p, prompt, output), x)


def test_process_logits_greedy_applies_only_penalties():
    logits = rand_logits(10)
    p = SamplingParams(temperature=0, top_k=1, top_p=0.1, min_p=0.9, repetition_penalty=1.5)
    out = process_logits(logits, p, [0, 1], [2])
    assert_same(out, ref_repetition(logits.tolist(), [0, 1, 2], 1.5))


# --- the sampler ----------------------------------------------------------------------------

def draw(params: SamplingParams, logits: torch.Tensor, n: int) -> Counter:
    s = Sampler(params)
    return Counter(s.sample(logits, [], []) for _ in range(n))


def test_greedy_sampler_picks_argmax_lowest_id_on_ties():
    for seed in range(5):
        logits = rand_logits(seed)
        assert Sampler(SamplingParams(temperature=0)).sample(logits, [], []) == int(np.argmax(logits.numpy()))
    tied = torch.tensor([0.0, 2.0, 1.0, 2.0])
    assert Sampler(SamplingParams(temperature=0)).sample(tied, [], []) == 1


def test_greedy_penalties_change_argmax():
    logits = torch.tensor([1.0, 3.0, 2.5, 0.0])
    assert Sampler(SamplingParams(temperature=0)).sample(logits, [1], [1]) == 1
    # repetition: 3.0 / 1.5 = 2.0 < 2.5
    assert Sampler(SamplingParams(temperature=0, repetition_penalty=1.5)).sample(logits, [1], []) == 2
    # presence/frequency: 3.0 - 0.2 - 2 * 0.3 = 2.2 < 2.5
    params = SamplingParams(temperature=0, presence_penalty=0.2, frequency_penalty=0.3)
    assert Sampler(params).sample(logits, [], [1, 1]) == 2
    # the prompt does not count for presence/frequency
    assert Sampler(params).sample(logits, [1, 1, 1], []) == 1


@pytest.mark.parametrize("params,allowed", [
    (SamplingParams(top_k=3, seed=1), {0, 1, 2}),
    (SamplingParams(top_p=0.6, seed=2), {0, 1}),  # probs .4 .3 .15 ...: .4 < .6 <= .7
    (SamplingParams(min_p=0.5, seed=3), {0, 1}),  # .3 >= .5 * .4 > .15
])
def test_filters_never_sample_outside_allowed_set(params, allowed):
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    counts = draw(params, probs.log(), 2000)
    assert set(counts) == allowed  # every allowed token shows up, nothing else does


def chi_square(counts: Counter, probs: torch.Tensor, n: int) -> float:
    expected = probs.double() * n
    return sum((counts.get(i, 0) - e) ** 2 / e for i, e in enumerate(expected.tolist()))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_temperature_sampling_matches_softmax(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, 1.5])
    n = 2000
    counts = draw(SamplingParams(temperature=temperature, seed=123), logits, n)
    stat = chi_square(counts, torch.softmax(logits / temperature, -1), n)
    assert stat < 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def test_chi_square_check_detects_wrong_temperature():
    # guards the test above: sampling at t=1 must fail a check against t=0.6
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, 1.5])
    counts = draw(SamplingParams(temperature=1.0, seed=123), logits, 2000)
    assert chi_square(counts, torch.softmax(logits / 0.6, -1), 2000) > 24.32


def seq(sampler: Sampler, steps: int = 50, vocab: int = 50, device: str = "cpu") -> list[int]:
    out: list[int] = []
    for step in range(steps):
        out.append(sampler.sample((rand_logits(1000 + step, vocab) / 3).to(device), [], out))
    return out


def test_seeded_sampling_is_reproducible():
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    a, b = seq(Sampler(params)), seq(Sampler(params))
    assert a == b
    c = seq(Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=43)))
    assert a != c


def test_unseeded_samplers_differ_and_leave_global_rng_alone():
    state = torch.get_rng_state()
    a, b = seq(Sampler(SamplingParams())), seq(Sampler(SamplingParams()))
    assert a != b
    assert torch.equal(torch.get_rng_state(), state)


def test_seeded_sampler_ignores_global_rng():
    params = SamplingParams(seed=5)
    torch.manual_seed(0)
    a = seq(Sampler(params))
    torch.manual_seed(1)
    assert seq(Sampler(params)) == a


def test_sampler_consumes_same_randomness_whatever_the_logits():
    # after steps on different logits, two same-seed samplers make the same next draw
    a, b = Sampler(SamplingParams(seed=9)), Sampler(SamplingParams(seed=9))
    for step in range(10):
        a.sample(rand_logits(step), [], [])
        b.sample(rand_logits(100 + step), [], [])
    final = rand_logits(500)
    assert [a.sample(final, [], []) for _ in range(20)] == [b.sample(final, [], []) for _ in range(20)]


def test_exponential_race_winner_survives_masking_other_tokens():
    # each token owns its own random number, so removing tokens that did not win (as top-k,
    # a grammar mask or a draft model's rejection may) leaves the winner unchanged;
    # inverse-CDF sampling (torch.multinomial) would shift to a neighbour instead
    logits = rand_logits(0, 20)
    for seed in range(30):
        winner = Sampler(SamplingParams(seed=seed)).sample(logits, [], [])
        masked = logits.clone()
        others = [i for i in range(20) if i != winner]
        masked[others[seed % 7::3]] = NEG_INF
        assert Sampler(SamplingParams(seed=seed)).sample(masked, [], []) == winner


def test_seeded_sampling_robust_to_tiny_logit_noise():
    params = SamplingParams(seed=11)
    a, b = Sampler(params), Sampler(params)
    noise = torch.Generator().manual_seed(0)
    for step in range(50):
        logits = rand_logits(step)
        jitter = torch.randn(logits.shape, generator=noise) * 1e-5
        assert a.sample(logits, [], []) == b.sample(logits + jitter, [], [])


def test_sampler_rejects_batched_logits():
    with pytest.raises(ValueError, match="1-D"):
        Sampler(SamplingParams(seed=0)).sample(torch.zeros(2, 5), [], [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sampler_generator_lives_on_logits_device():
    logits = rand_logits(0).cuda()
    s = Sampler(SamplingParams(seed=3, top_k=10))
    tok = s.sample(logits, [1], [2])
    assert s._generator.device.type == "cuda"
    assert 0 <= tok < 50 and torch.isfinite(apply_top_k(logits, 10)[tok])
    a = seq(Sampler(SamplingParams(seed=3)), device="cuda")
    assert a == seq(Sampler(SamplingParams(seed=3)), device="cuda")
    assert a != seq(Sampler(SamplingParams(seed=4)), device="cuda")


# --- SamplingParams validation ----------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("max_new_tokens", 0), ("max_new_tokens", 2.5),
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
    ("top_k", -2), ("top_k", 1.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", -0.5),
    ("min_p", -0.01), ("min_p", 1.5),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01),
    ("frequency_penalty", 3.0), ("frequency_penalty", -2.5),
    ("seed", 1.5),
    ("stop", [""]), ("stop", [1]), ("stop", ""), ("stop", 5),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["a"]),
])
def test_params_validation_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_params_validation_accepts_edges_and_defaults():
    p = SamplingParams()
    assert (p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (64, 1.0, 0, 1.0, 0.0)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (p.seed, p.stop, p.stop_token_ids, p.ignore_eos) == (None, [], [], False)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    SamplingParams(temperature=0, top_k=-1, top_p=1.0, min_p=1.0, presence_penalty=-2,
                   frequency_penalty=2, max_new_tokens=1, seed=0)
    assert SamplingParams().stop is not SamplingParams().stop  # no shared mutable default


def test_params_single_stop_string_becomes_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_token_logprobs_are_log_softmax_of_the_raw_logits():
    logits = torch.tensor([1.0, 3.0, -2.0, 2.5, 0.0])
    logp = torch.log_softmax(logits, dim=-1)
    chosen, top = token_logprobs(logits, 4, 3)
    assert chosen == pytest.approx(float(logp[4]))
    assert [i for i, _ in top] == [1, 3, 0]  # most likely first
    assert [v for _, v in top] == pytest.approx([float(logp[i]) for i in (1, 3, 0)])
    assert token_logprobs(logits, 2, 0)[1] == []
    assert math.fsum(math.exp(v) for v in logp.tolist()) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_sampling_params_rejects_bad_logprobs(bad):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=bad)


def test_sequence_attaches_logprobs_only_when_asked(byte_tok):
    logits = torch.randn(len(byte_tok))
    asked = Sequence([5], SamplingParams(temperature=0, logprobs=2), byte_tok).sample_and_append(logits)
    assert asked.token_id == int(torch.argmax(logits)) and len(asked.top_logprobs) == 2
    assert asked.logprob == pytest.approx(asked.top_logprobs[0][1])
    plain = Sequence([5], SamplingParams(temperature=0), byte_tok).sample_and_append(logits)
    assert plain.logprob is None and plain.top_logprobs is None


@pytest.mark.parametrize("seed", [SEED_MIN, -1, 0, SEED_MAX])
def test_sampling_params_seed_edges_sample(seed, byte_tok):
    """Every seed SamplingParams accepts can seed a generator: nothing fails later, at sampling."""
    seq = Sequence([5], SamplingParams(temperature=1.0, seed=seed), byte_tok)
    assert 0 <= seq.sample_and_append(torch.randn(len(byte_tok))).token_id < len(byte_tok)


@pytest.mark.parametrize("seed", [SEED_MAX + 1, SEED_MIN - 1, 10**30])
def test_sampling_params_refuses_seeds_a_generator_cannot_take(seed):
    with pytest.raises(ValueError, match="seed must be an integer in"):
        SamplingParams(seed=seed)
