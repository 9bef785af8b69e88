"""The verification rules on synthetic distributions, where the right answer is known exactly."""
import pytest
import torch

from course.s05_speculative import verify
from course.s05_speculative.verify import draw, verify_greedy, verify_sampled

# A target and a draft that disagree a lot: the draft puts its mass where the target puts little.
P = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
Q = torch.tensor([0.05, 0.05, 0.1, 0.1, 0.2, 0.5])
N = 20_000
# chi-square critical value, 5 degrees of freedom, false-failure rate 1e-4 (scipy.stats.chi2.isf(1e-4, 5))
CHI2_CRIT_DF5_1E4 = 25.74


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def first_tokens(k: int, point_mass: bool, seed: int = 0) -> torch.Tensor:
    """Counts of the first emitted token over N runs: draft ~ Q (or a fixed token), target P."""
    g = torch.Generator().manual_seed(seed)
    target = P.expand(k + 1, -1)
    counts = torch.zeros(len(P))
    for _ in range(N):
        if point_mass:
            draft, probs = [4] * k, None
        else:
            draft = [draw(Q, g) for _ in range(k)]
            probs = Q.expand(k, -1)
        counts[verify_sampled(target, draft, probs, g)[0]] += 1
    return counts


@pytest.mark.parametrize("k,point_mass", [(1, False), (3, False), (2, True)])
def test_rejection_sampling_emits_the_targets_distribution(k, point_mass):
    assert chi_square(first_tokens(k, point_mass), P) < CHI2_CRIT_DF5_1E4


def test_without_the_residual_correction_the_distribution_is_wrong(monkeypatch):
    """The test above can fail: resampling from p instead of norm(max(p - q, 0)) is caught."""
    monkeypatch.setattr(verify, "residual", lambda p, q: p)
    assert chi_square(first_tokens(1, False), P) > 10 * CHI2_CRIT_DF5_1E4


def test_residual_is_where_the_target_wants_more():
    r = verify.residual(P, Q)
    assert torch.allclose(r, torch.tensor([0.45, 0.15, 0, 0, 0, 0]) / 0.6)
    assert torch.equal(verify.residual(P, P), P)  # no excess anywhere: fall back to p


def test_greedy_keeps_the_matching_prefix_then_the_targets_token():
    logits = torch.full((3, 10), -1.0)
    logits[0, 3] = logits[1, 5] = logits[2, 7] = 1.0  # the target's choices: 3, 5, 7
    assert verify_greedy(logits, [3, 5]) == [3, 5, 7]  # all accepted + bonus
    assert verify_greedy(logits, [3, 4]) == [3, 5]     # second rejected, corrected
    assert verify_greedy(logits, [9, 5]) == [3]        # first rejected: nothing after counts
    assert verify_greedy(logits[:1], []) == [3]        # no draft: a plain decode step


def test_a_perfect_draft_is_always_accepted():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = [draw(P, g) for _ in range(3)]
        assert verify_sampled(P.expand(4, -1), draft, P.expand(3, -1), g)[:3] == draft
