"""The draft-length policy: its fits recover the costs they are fed, it drafts deep where a draft
pays and not at all where it cannot, follows each request's own acceptance, keeps measuring
at a bounded price, and inside the engine never changes a greedy token."""
import pytest

from course.final.engine import Engine, SpeculativeConfig
from course.final.speculation.policy import EXPLORE_EVERY, WARM_UP_STEPS, CostModelPolicy, LinearFit
from course.final.tests.test_engine_speculative import PROMPTS, GREEDY, OracleDrafter, reference
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig


def measured(fixed=0.020, per_row=0.001, per_draft=0.002, rates=None):
    """A policy that has seen steps costing fixed + per_row x rows, and draft steps of per_draft."""
    policy = CostModelPolicy()
    for rows in [1, 2, 3, 5, 8, 1, 4, 6, 2, 7]:
        policy.observe_step(rows, fixed + per_row * rows, all_decode=True)
    policy.observe_drafting(-1, 1, 5.0)  # a first proposal (the prompt's catch-up): left out
    policy.observe_drafting(-1, 4, 4 * per_draft)
    for drafted, accepted in (rates or []):
        policy.record(-1, drafted, accepted)
    return policy


def test_the_step_fit_recovers_fixed_and_per_row_costs():
    fit = LinearFit()
    for rows in range(1, 20):
        fit.add(rows, 0.03 + 0.002 * rows)
    slope, intercept = fit.slope_intercept()
    assert slope == pytest.approx(0.002) and intercept == pytest.approx(0.03)
    flat = LinearFit()
    for _ in range(10):
        flat.add(4, 0.05)
    assert flat.slope_intercept() is None  # one row count only: no slope to see


def test_before_the_costs_are_measured_every_request_drafts_up_to_its_limit():
    policy = CostModelPolicy()
    for _ in range(WARM_UP_STEPS - 1):
        policy.observe_step(5, 0.03, all_decode=True)
    assert policy.lengths({1: 4, 2: 2}) == {1: 4, 2: 2}


def test_a_lone_request_with_good_drafts_drafts_deep_and_a_wide_batch_drafts_nothing():
    good = [(4, 4)] * 20  # every draft kept
    policy = measured(rates=good)
    assert policy.lengths({7: 4}) == {7: 4}
    wide = measured(fixed=0.020, per_row=0.004, per_draft=0.004, rates=[(4, 1)] * 20)  # rows cost, drafts miss
    chosen = wide.lengths({i: 4 for i in range(40)})
    assert sum(chosen.values()) <= 1  # at most the one exploring draft


def test_each_request_drafts_by_its_own_acceptance():
    policy = measured(per_row=0.002, per_draft=0.004, rates=[(4, 2)] * 10)
    for _ in range(30):
        policy.record(1, 4, 4)  # request 1: every draft kept
        policy.record(2, 4, 0)  # request 2: every first draft missed
    chosen = policy.lengths({1: 4, 2: 4})
    assert chosen[1] == 4 and chosen[2] == 0


def test_exploration_is_one_draft_every_few_steps_and_only_when_cheap():
    policy = measured(per_row=0.002, per_draft=0.002, rates=[(4, 0)] * 30)  # nothing is ever kept
    drafts = [sum(policy.lengths({1: 4, 2: 4}).values()) for _ in range(4 * EXPLORE_EVERY)]
    assert sum(drafts) == 4 and max(drafts) == 1  # one draft per EXPLORE_EVERY steps
    costly = measured(fixed=0.001, per_row=0.002, per_draft=0.020, rates=[(4, 0)] * 30)  # > 3% of 8 steps
    assert sum(sum(costly.lengths({1: 4}).values()) for _ in range(4 * EXPLORE_EVERY)) == 0


def test_finished_requests_leave_nothing_behind():
    policy = measured()
    policy.record(5, 3, 1)
    policy.observe_drafting(5, 1, 0.01)
    policy.lengths({5: 3})
    policy.prune(set())
    assert not policy.per_request and not policy.steps_since_draft and not policy.caught_up


@pytest.mark.parametrize("wrong_every", [3, 1])  # two drafts in three kept, or none
def test_the_engine_with_the_policy_keeps_every_greedy_token(byte_tok, wrong_every):
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    truth = {tuple(p): w for p, w in zip(PROMPTS, want)}
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 4),
                    drafter=OracleDrafter(truth, wrong_every=wrong_every))
    history = [(4, 4 if wrong_every > 1 else 0)] * 10  # what the engine's drafts got so far
    engine.draft_policy = policy = measured(per_row=0.001, rates=history)
    policy.observe_step = lambda *a, **k: None  # the costs stay those set here, whatever this machine takes
    policy.observe_drafting = lambda *a, **k: None
    ids = [engine.add_request(list(p), GREEDY) for p in PROMPTS]
    drafted = []  # drafts verified in each step
    while engine.has_unfinished():
        engine.step()
        drafted.append(sum(len(d) for d in engine.drafts.values()))
    assert [engine.requests[r].seq.output_ids for r in ids] == want
    if wrong_every > 1:
        assert sum(drafted) > len(drafted)  # several drafts a step
    else:  # drafts that never land: one exploring draft every EXPLORE_EVERY steps
        assert 0 < sum(drafted) <= len(drafted) // EXPLORE_EVERY + 1 and max(drafted) == 1


def test_a_proposals_fixed_cost_is_paid_once_so_drafts_come_in_bundles():
    """Proposals cost 10 ms + 1 ms a token: the fit splits the two, and a request weighs its
    first drafts together (one draft alone would not pay for the call; three do)."""
    policy = measured(fixed=0.020, per_row=0.001)
    policy.draft_time = type(policy.draft_time)()
    for tokens in (1, 2, 4, 3, 1, 4):
        policy.observe_drafting(-1, tokens, 0.010 + 0.001 * tokens)
    fixed, per_row, per_call, per_draft = policy.costs()
    assert per_call == pytest.approx(0.010) and per_draft == pytest.approx(0.001)
    for _ in range(20):
        policy.record(3, 4, 2)  # drafts 1 and 2 kept, 3 missed: ~0.7 at position 1
    chosen = policy.lengths({3: 4})[3]
    assert chosen >= 2
