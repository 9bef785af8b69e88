"""Skip-Join MLFQ inside final/'s engine, asserted on the schedule (levels, steps, finishing
order), never on time: service is counted with a cost model whose numbers the tests choose."""
import pytest
import torch

from course.final.scheduling.cost_model import LinearCostModel
from course.final.engine import Engine
from course.final.scheduling.policies import MLFQConfig, SkipJoinMLFQ, make_policy
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, byte_tokenizer, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

STEP = 1 / 64  # exact in binary: sums of charges compare exactly with the quanta
FLAT = LinearCostModel(fixed_s=STEP, per_token_s=0.0, per_seq_s=0.0, per_kv_token_s=0.0)  # every chunk costs STEP
SLOPED = LinearCostModel(fixed_s=STEP, per_token_s=1 / 256, per_seq_s=0.0, per_kv_token_s=0.0)
TOKENIZER = byte_tokenizer()


def prompt(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def engine(policy, model=None, **config):
    config = {"num_blocks": 64, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64} | config
    return Engine(model or tiny_model("gqa_tied"), TOKENIZER, KernelEngineConfig(**config), [TINY_EOS], policy=policy)


def run(llm, arrivals):
    """arrivals: {step: [(prompt, params, priority)]}. Returns (ids in arrival order, {id: step it finished})."""
    ids, done, step = [], {}, 0
    while llm.has_unfinished() or any(s >= step for s in arrivals):
        ids += [llm.add_request(p, sp, pr) for p, sp, pr in arrivals.get(step, [])]
        llm.step()
        done.update({r: step for r in ids if llm.requests[r].finished and r not in done})
        step += 1
    return ids, done


@pytest.mark.parametrize("prompt_tokens, level", [(1, 0), (12, 0), (13, 1), (28, 1), (29, 2), (60, 2), (61, 3),
                                                  (5000, 3)])
def test_join_level_follows_the_cost_model(prompt_tokens, level):
    # prefill of n tokens: (4 + n) / 256 s; quanta 16/256, 32/256, 64/256, 128/256 s
    mlfq = SkipJoinMLFQ(SLOPED, MLFQConfig(base_quantum_s=16 / 256, ratio=2, num_levels=4))
    assert mlfq.join_level(prompt_tokens) == level


def test_demotion_exactly_when_a_quantum_is_used_up(byte_tok):
    mlfq = SkipJoinMLFQ(FLAT, MLFQConfig(base_quantum_s=3 * STEP, ratio=2, num_levels=4))  # 3, 6, 12, 24 steps
    llm = engine(mlfq)
    rid = llm.add_request(prompt(4, 0), greedy(30))
    levels = []
    while not llm.requests[rid].finished:
        llm.step()
        if not llm.requests[rid].finished:
            levels.append(mlfq.level(llm.requests[rid]))
    changes = [i + 1 for i in range(1, len(levels)) if levels[i] != levels[i - 1]]
    assert levels[0] == 0 and changes == [3, 9, 21]  # after 3, 3+6 and 3+6+12 steps of service
    assert mlfq.demotions == 3


def starving_run(starvation_s):
    """A long request, then a stream of 2-step requests arriving every 2 steps into one seat."""
    mlfq = SkipJoinMLFQ(FLAT, MLFQConfig(base_quantum_s=3 * STEP, ratio=2, num_levels=4, starvation_s=starvation_s))
    llm = engine(mlfq, max_num_seqs=1)
    arrivals = {0: [(prompt(4, 0), greedy(20), 0)]} | {s: [(prompt(4, s), greedy(2), 0)] for s in range(4, 80, 2)}
    ids, done = run(llm, arrivals)
    served = [i for i, step in enumerate(llm.step_log) if ids[0] in [r for r, _, _ in step["chunks"]]]
    return max(b - a for a, b in zip(served, served[1:])), mlfq.promotions, done, ids


def test_a_starved_request_is_promoted_within_the_bound():
    gap, promotions, done, ids = starving_run(starvation_s=10 * STEP)
    # unserved for more than 10 steps -> level 0 -> runs once the short request in the seat is done
    assert promotions > 0 and gap <= 10 + 1 + 2
    never_gap, never, never_done, _ = starving_run(starvation_s=1e9)  # no promotion: it waits for the stream
    assert never == 0 and never_gap > 60 and never_done[ids[0]] > done[ids[0]]


def test_a_short_request_behind_long_ones_finishes_first_under_mlfq_and_last_under_fcfs(byte_tok):
    arrivals = {0: [(prompt(40, 1), greedy(30), 0), (prompt(40, 2), greedy(30), 0)],
                2: [(prompt(3, 3), greedy(3), 0)]}
    model = tiny_model("gqa_tied")
    outputs = {}
    for name in ("fcfs", "mlfq"):
        policy = make_policy(name, SLOPED, MLFQConfig(base_quantum_s=16 / 256))
        llm = engine(policy, model, max_num_seqs=2)
        ids, done = run(llm, arrivals)
        order = sorted(ids, key=lambda r: (done[r], r))
        assert order[-1 if name == "fcfs" else 0] == ids[2], name
        outputs[name] = [llm.requests[r].seq.output_ids for r in ids]
    assert outputs["fcfs"] == outputs["mlfq"]


class CheckedMLFQ(SkipJoinMLFQ):
    """Asserts that memory-pressure victims come from the lowest level among the candidates."""

    victims = 0

    def choose_victim(self, running, paused):
        victim = super().choose_victim(running, paused)
        assert self.level(victim) == max(self.level(r) for r in paused + running[-1:])
        self.victims += 1
        return victim


def test_every_policy_gives_every_request_the_same_tokens_under_preemption():
    model = tiny_model("mqa_odd_heads")
    lens = [(30, 20), (5, 12), (44, 6), (3, 25), (17, 9), (9, 14), (26, 3), (2, 18)]
    arrivals = {}
    for i, (p, o) in enumerate(lens):
        arrivals.setdefault(2 * (i // 2), []).append((prompt(p, 10 + i), greedy(o), i % 3))
    reference = engine(make_policy("fcfs"), model, num_blocks=128)
    ids, _ = run(reference, arrivals)
    want = [reference.requests[r].seq.output_ids for r in ids]
    for name in ("fcfs", "priority", "mlfq"):
        policy = CheckedMLFQ(SLOPED, MLFQConfig(base_quantum_s=16 / 256)) if name == "mlfq" else make_policy(name)
        llm = engine(policy, model, num_blocks=14, max_num_seqs=3, max_num_batched_tokens=16)
        ids, _ = run(llm, arrivals)
        assert [llm.requests[r].seq.output_ids for r in ids] == want, name
        assert llm.scheduler.num_preemptions > 0, name  # the pool was meant to be too small
        assert llm.blocks.num_free_blocks == 14, name   # and it is whole again
        if name != "fcfs":
            assert llm.scheduler.num_pauses > 0, name
    assert policy.victims > 0 and policy.demotions > 0
