"""The draft-length policy: its fits recover the costs they are fed (a step's time is not one line
in its rows: narrow steps are memory-bound, wide ones compute-bound), it drafts deep where a
draft pays and not at all where it cannot, follows each request's own acceptance, keeps
measuring at a bounded price, and inside the engine never changes a greedy token."""
from collections import defaultdict

import pytest

from course.final.engine import Engine, SpeculativeConfig
from course.final.speculation.policy import (CATCH_UP_STEPS, EXPLORE_EVERY, PRIOR_SHARE, WARM_UP_PROPOSALS, WARM_UP_STEPS,
                                             CostModelPolicy, LeastSquares, StepTimes)
from course.final.tests.test_engine_speculative import PROMPTS, GREEDY, OracleDrafter, reference
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig


def measured(fixed=0.020, per_row=0.001, per_draft=0.002, rates=None):
    """A policy that has seen steps costing fixed + per_row x rows, and draft steps of per_draft."""
    policy = CostModelPolicy()
    for rows in [1, 2, 3, 5, 8, 1, 4, 6, 2, 7]:
        policy.observe_step(rows, fixed + per_row * rows, all_decode=True)
    for _ in range(WARM_UP_PROPOSALS):
        policy.observe_drafting(4, 4 * per_draft)
    for drafted, accepted in (rates or []):
        policy.record(-1, drafted, accepted)
    return policy


def test_the_drafting_fit_recovers_its_costs_per_call_per_token_and_per_position_read():
    fit = LeastSquares(2)
    for tokens, read in [(1, 1), (4, 2), (2, 300), (3, 5), (4, 1), (1, 120), (2, 2)]:
        fit.add((tokens, read), 0.003 + 0.001 * tokens + 0.00007 * read)
    assert fit.coefficients() == pytest.approx([0.003, 0.001, 0.00007], rel=1e-4)
    same = LeastSquares(2)
    for _ in range(10):
        same.add((4, 1), 0.010)  # a column that never varies: some split, never negative, the same total
    c0, c1, c2 = same.coefficients()
    assert min(c0, c1, c2) >= 0 and c0 + 4 * c1 + c2 == pytest.approx(0.010, rel=1e-4)
    falling = LeastSquares(1)
    for x, y in [(1, 0.05), (2, 0.04), (3, 0.03)]:
        falling.add((x,), y)
    assert falling.coefficients() == pytest.approx([0.04, 0.0], rel=0.01)  # a negative slope is dropped: the mean


def roofline(rows: int) -> float:
    """A CPU step's seconds: reading the weights (30 ms) bounds it up to 16 rows, then each row's
    products (1.5 ms a row) do."""
    return max(0.030, 0.0015 * rows) + 0.0001 * rows


def test_the_step_times_see_where_a_row_is_nearly_free_and_where_it_costs_its_share():
    times = StepTimes()
    for rows in [1, 2, 3, 4, 5, 6, 8, 12, 20, 24, 30, 40, 50, 60, 80]:
        times.add(rows, roofline(rows))
    assert times.per_row(2) < 0.0005  # memory-bound: a verified row costs ~1% of the step
    assert times.per_row(50) == pytest.approx(0.0016, rel=0.1)  # compute-bound: its share
    assert times.at(10) == pytest.approx(roofline(10), rel=0.05) and times.at(45) == pytest.approx(roofline(45), rel=0.05)
    one_size = StepTimes()
    for seconds in (0.070, 0.074, 0.072):
        one_size.add(40, seconds)
    assert one_size.per_row(40) == pytest.approx(PRIOR_SHARE * 0.072 / 40, rel=0.05)  # no slope seen: the prior


def test_before_the_costs_are_measured_one_request_at_a_time_drafts_up_to_its_limit():
    policy = CostModelPolicy()
    for _ in range(WARM_UP_STEPS - 1):
        policy.observe_step(5, 0.03, all_decode=True)
    assert policy.lengths({1: 4}) == {1: 4}  # a lone request drafts as it would anyway
    assert policy.lengths({3: 4, 2: 2, 9: 4}) == {3: 0, 2: 2, 9: 0}  # a wide batch pays for a few rows only
    for _ in range(WARM_UP_PROPOSALS):
        policy.observe_drafting(2, 0.004)
    assert policy.lengths({3: 4, 2: 2, 9: 4}) == {3: 0, 2: 0, 9: 0}  # drafting timed, steps not yet: none


def test_one_policy_drafts_for_a_narrow_batch_and_not_for_a_wide_one():
    """The same measured machine: at 2 requests a verified row is nearly free and drafts pay; at
    40 a row costs its share of the products and they do not (a single line through all the
    steps would get both wrong)."""
    policy = CostModelPolicy()
    for rows in [1, 2, 4, 6, 8, 10, 12, 16, 24, 32, 40, 48, 64, 80, 120, 160, 200] * 2:
        policy.observe_step(rows, roofline(rows), all_decode=True)
    for tokens in (1, 2, 3, 4) * 3:
        policy.observe_drafting(tokens, 0.002 + 0.001 * tokens)
    for _ in range(20):
        policy.record(-1, 4, 2)  # drafts 1 and 2 kept, 3 missed
    assert policy.lengths({1: 4, 2: 4}) == {1: 2, 2: 2}  # both draft what is kept
    wide = policy.lengths({i: 4 for i in range(40)})
    assert sum(1 for k in wide.values() if k) <= 1  # at most the one exploring request


def test_a_lone_request_with_good_drafts_drafts_deep_and_a_wide_batch_drafts_nothing():
    good = [(4, 4)] * 20  # every draft kept
    policy = measured(rates=good)
    assert policy.lengths({7: 4}) == {7: 4}
    wide = measured(fixed=0.020, per_row=0.004, per_draft=0.004, rates=[(4, 1)] * 20)  # rows cost, drafts miss
    chosen = wide.lengths({i: 4 for i in range(40)})
    assert sum(1 for k in chosen.values() if k) <= 1  # at most the one exploring request


def test_each_request_drafts_by_its_own_acceptance():
    policy = measured(per_row=0.002, per_draft=0.004, rates=[(4, 2)] * 10)
    for _ in range(30):
        policy.record(1, 4, 4)  # request 1: every draft kept
        policy.record(2, 4, 0)  # request 2: every first draft missed
    chosen = policy.lengths({1: 4, 2: 4})
    assert chosen[1] == 4 and chosen[2] == 0


def test_exploration_is_one_draft_every_few_steps_and_only_when_cheap():
    # nothing is ever kept; one token (1.3 ms) is all that 1% of 8 steps of 24 ms buys
    policy = measured(per_row=0.0005, per_draft=0.0008, rates=[(4, 0)] * 30)
    drafts = [sum(policy.lengths({1: 4, 2: 4}).values()) for _ in range(4 * EXPLORE_EVERY)]
    assert sum(drafts) == 4 and max(drafts) == 1  # one draft per EXPLORE_EVERY steps (all the budget buys)
    cheap = measured(per_row=0.0001, per_draft=0.0001, rates=[(4, 0)] * 30)
    drafts = [sum(cheap.lengths({1: 4, 2: 4}).values()) for _ in range(2 * EXPLORE_EVERY)]
    assert sum(drafts) == 8 and max(drafts) == 4  # where the budget buys more, a whole draft of k
    costly = measured(fixed=0.001, per_row=0.002, per_draft=0.020, rates=[(4, 0)] * 30)  # > 1% of 8 steps
    assert sum(sum(costly.lengths({1: 4}).values()) for _ in range(4 * EXPLORE_EVERY)) == 0


def test_finished_requests_leave_nothing_behind():
    policy = measured()
    policy.record(5, 3, 1)
    policy.lengths({5: 3})
    policy.prune(set())
    assert not policy.per_request and not policy.steps_since_draft


@pytest.mark.parametrize("wrong_every", [3, 1])  # two drafts in three kept, or none
def test_the_engine_with_the_policy_keeps_every_greedy_token(byte_tok, wrong_every):
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    truth = {tuple(p): w for p, w in zip(PROMPTS, want)}
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 4),
                    drafter=OracleDrafter(truth, wrong_every=wrong_every))
    history = [(4, 4 if wrong_every > 1 else 0)] * 10  # what the engine's drafts got so far
    engine.draft_policy = policy = measured(per_row=0.0005, per_draft=0.0008, rates=history)
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
    else:  # drafts that never land: one exploring request every EXPLORE_EVERY steps, a token or two
        assert 0 < sum(1 for d in drafted if d) <= len(drafted) // EXPLORE_EVERY + 1 and max(drafted) <= 2


def test_a_proposals_fixed_cost_is_paid_once_so_drafts_come_in_bundles():
    """Proposals cost 10 ms + 1 ms a token: the fit splits the two, and a request weighs its
    first drafts together (one draft alone would not pay for the call; three do)."""
    policy = measured(fixed=0.020, per_row=0.001)
    policy.draft_time = type(policy.draft_time)(2)
    for tokens in (1, 2, 4, 3, 1, 4):
        policy.observe_drafting(tokens, 0.010 + 0.001 * tokens, read=tokens % 2 + 1)
    costs = policy.costs(1)
    assert costs.per_call == pytest.approx(0.010, abs=1e-6) and costs.per_draft == pytest.approx(0.001, abs=1e-6)
    for _ in range(20):
        policy.record(3, 4, 2)  # drafts 1 and 2 kept, 3 missed: ~0.7 at position 1
    chosen = policy.lengths({3: 4})[3]
    assert chosen >= 2


def test_a_long_catch_up_is_charged_over_several_steps_so_an_idle_request_drafts_again(monkeypatch):
    """Reading 2,000 positions costs 140 ms: charged to one step, its drafts would never pay for it
    (the request would stay idle for good); charged over CATCH_UP_STEPS steps they do. A catch-up
    so long that even that does not pay keeps the request from drafting."""
    policy = measured(fixed=0.020, per_row=0.0005, rates=[(4, 4)] * 20)
    policy.draft_time = LeastSquares(2)
    for tokens, read in [(1, 1), (4, 2), (2, 300), (3, 5), (4, 1), (1, 120), (2, 2)]:
        policy.observe_drafting(tokens, 0.001 + 0.001 * tokens + 0.00007 * read, read)
    assert policy.lengths({1: 4}, reads={1: 2000})[1] == 4
    assert policy.lengths({1: 4}, reads={1: 200_000})[1] == 0
    monkeypatch.setattr("course.final.speculation.policy.CATCH_UP_STEPS", 1)
    assert policy.lengths({1: 4}, reads={1: 2000})[1] == 0


def test_a_size_no_step_refreshed_for_long_is_forgotten(monkeypatch):
    monkeypatch.setattr("course.final.speculation.policy.STALE_STEPS", 10)
    times = StepTimes()
    times.add(1, 0.050)  # a slow first step (a cold process)
    for _ in range(11):
        times.add(5, 0.020)
    assert [round(r) for r, _, _ in times.curve()] == [5]


def test_a_request_whose_drafts_missed_is_tried_again_once_its_misses_have_aged(monkeypatch):
    """On a lone request a draft costs 3 ms of a 14 ms step: worth it from ~1 in 5 kept. After a
    run of misses the request stops drafting; while it drafts nothing its counts age back towards
    the engine's rate, and it drafts again within a few dozen steps (exploration off here)."""
    monkeypatch.setattr("course.final.speculation.policy.EXPLORE_BUDGET", 0.0)
    policy = measured(fixed=0.014, per_row=0.001, per_draft=0.002, rates=[(2, 1)] * 20)
    for _ in range(10):
        policy.record(7, 2, 0)
    chosen = [policy.lengths({7: 2})[7] for _ in range(60)]
    first = next((i for i, k in enumerate(chosen) if k), None)
    assert chosen[0] == 0 and first is not None


def test_the_engine_counts_a_prefill_chunk_among_the_steps_rows(byte_tok):
    """A step that also prefills a long prompt is as wide as its chunk: the policy is told those
    rows (up to the token budget), not one row per prefilling request, and no room is left for
    drafts that would push the chunk out."""
    model = tiny_model("gqa_tied")
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 2),
                    drafter=OracleDrafter(defaultdict(list), wrong_every=1))  # drafts nothing
    engine.draft_policy = policy = measured()
    told, lengths = [], policy.lengths
    policy.lengths = lambda limits, other_rows=0, reads=None, room=None: (
        told.append((len(limits), other_rows, room)), lengths(limits, other_rows, reads, room))[1]
    engine.add_request(list(b"hi"), GREEDY)
    engine.step()  # its prefill
    engine.add_request(list(b"a long prompt of forty bytes, chunked..."), GREEDY)
    for _ in range(3):
        engine.step()
    assert (1, 11, 0) in told  # one decoding request beside a chunk that fills the other 11 rows of 12


def test_drafts_fit_the_room_the_budget_leaves():
    policy = measured(rates=[(4, 4)] * 20)  # every draft kept: each request would draft 4
    assert policy.lengths({1: 4, 2: 4}) == {1: 4, 2: 4}
    assert policy.lengths({1: 4, 2: 4}, room=5) == {1: 4, 2: 1}
    assert policy.lengths({1: 4, 2: 4}, room=0) == {1: 0, 2: 0}


def test_under_the_policy_a_seeded_sampled_request_is_not_drafted_and_reproduces_in_a_crowd(byte_tok):
    """Its draws would follow the drafts the load gives it: it decodes plainly, and its tokens
    alone equal its tokens beside three other requests; an unseeded sampled request still drafts."""
    model = tiny_model("gqa_tied")
    seeded = SamplingParams(max_new_tokens=12, temperature=0.8, seed=11, ignore_eos=True)
    unseeded = SamplingParams(max_new_tokens=12, temperature=0.8, ignore_eos=True)

    def run(crowd: int):
        config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=32)
        engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 3),
                        drafter=OracleDrafter(defaultdict(lambda: [7] * 16), wrong_every=2))
        engine.draft_policy = measured(rates=[(3, 3)] * 20)  # drafts pay: every request would draft
        ids = [engine.add_request(list(PROMPTS[0]), seeded)]
        ids += [engine.add_request(list(p), unseeded) for p in PROMPTS[1:1 + crowd]]
        drafted = set()
        while engine.has_unfinished():
            engine.step()
            drafted |= set(engine.drafts)
        return engine.requests[ids[0]].seq.output_ids, ids[0] in drafted, bool(drafted - {ids[0]})

    alone, seeded_drafted, _ = run(0)
    crowded, _, others_drafted = run(3)
    assert alone == crowded and not seeded_drafted and others_drafted


def test_drafts_follow_the_measured_curve_where_rows_come_in_steps(monkeypatch):
    """The C kernel multiplies rows in blocks: here 1 to 4 rows cost the same and a fifth adds
    7 ms. Read off the curve, a lone request's first three drafts are nearly free and the fourth
    is not (a straight line through the points would charge each row 1.4 ms and stop at two)."""
    monkeypatch.setattr("course.final.speculation.policy.EXPLORE_BUDGET", 0.0)
    policy = CostModelPolicy()
    for rows, ms in [(1, 13.0), (2, 13.05), (3, 13.1), (4, 13.15), (5, 20.0)] * 3:
        policy.observe_step(rows, ms / 1e3, all_decode=True)
    for tokens in (1, 2, 3, 4) * 2:
        policy.observe_drafting(tokens, 0.001 * tokens)
    policy.everyone.tried, policy.everyone.kept = [1000.0] * 4, [600.0] * 4  # each draft kept 60% of the time
    assert policy.lengths({1: 4}) == {1: 3}
    described = policy.describe()  # what the engine's stats (and /metrics' readers) get
    assert described["measured"] and described["step_ms_by_rows"][5] == pytest.approx(20.0)
    assert described["per_draft_ms"] == pytest.approx(1.0, rel=0.05)
