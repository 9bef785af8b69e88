"""The policy seam: vLLM's priority policy orders requests, displaces lower priorities when the
running set is full (pausing them: their blocks stay) or memory is short (preempting them), and
a preempted request keeps its priority. Asserted on the schedule, never on time."""
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.policy import Priority
from course.s04_continuous_batching.request import Status


def prompt(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def engine(byte_tok, **config):
    config = {"num_blocks": 64, "block_size": 4, "max_num_batched_tokens": 32} | config
    return LLMEngine(tiny_model("gqa_tied"), byte_tok, EngineConfig(**config), policy=Priority())


def run(llm, arrivals):
    """arrivals: {step: [(prompt, params, priority)]}. Returns (request ids in arrival order,
    the step each request finished at)."""
    ids, done, step = [], {}, 0
    while step in arrivals or llm.has_unfinished() or any(s > step for s in arrivals):
        ids += [llm.add_request(p, sp, pr) for p, sp, pr in arrivals.get(step, [])]
        llm.step()
        done.update({r: step for r in ids if llm.requests[r].finished and r not in done})
        step += 1
    return ids, done


def test_priority_orders_by_value_then_arrival(byte_tok):
    llm = engine(byte_tok, max_num_seqs=1)
    ids, done = run(llm, {0: [(prompt(5, i), greedy(3), pr) for i, pr in enumerate([2, 0, 1, 0])]})
    assert sorted(ids, key=done.get) == [ids[1], ids[3], ids[2], ids[0]]  # 0, 0 (by arrival), 1, 2


def test_higher_priority_pauses_a_running_request_when_the_seats_are_full(byte_tok):
    llm = engine(byte_tok, max_num_seqs=1)
    low = llm.add_request(prompt(6, 1), greedy(12), priority=5)
    for _ in range(3):
        llm.step()
    blocks = list(llm.blocks.tables[low])
    high = llm.add_request(prompt(6, 2), greedy(4), priority=0)
    llm.step()
    assert [r for r, _, _ in llm.step_log[-1]["chunks"]] == [high]
    assert llm.requests[low].status is Status.PAUSED
    assert llm.blocks.tables[low] == blocks  # paused: its KV stays, nothing to recompute
    computed = llm.requests[low].num_computed_tokens
    while not llm.requests[high].finished:
        llm.step()
    assert not llm.requests[low].finished and llm.requests[low].num_computed_tokens == computed
    while llm.has_unfinished():
        llm.step()
    assert llm.scheduler.num_preemptions == 0 and llm.scheduler.num_pauses == 1
    alone = LLMEngine(llm.model, byte_tok, EngineConfig(num_blocks=64, block_size=4))
    assert llm.requests[low].seq.output_ids == alone.generate([prompt(6, 1)], greedy(12))[0].token_ids
    assert llm.blocks.num_free_blocks == 64


def test_higher_priority_preempts_when_memory_is_short_and_the_victim_keeps_its_priority(byte_tok):
    # 12 blocks of 4: the low-priority request (40 prompt + 8 out) leaves too little for another
    llm = engine(byte_tok, num_blocks=12, max_num_seqs=4)
    low = llm.add_request(prompt(40, 3), greedy(8), priority=5)
    llm.step()
    llm.step()
    high = llm.add_request(prompt(20, 4), greedy(4), priority=0)
    later = llm.add_request(prompt(8, 5), greedy(2), priority=6)  # arrives after, ranks below low
    llm.step()
    assert low in llm.step_log[-1]["preempted"] and llm.requests[low].priority == 5
    assert [r for r, _, _ in llm.step_log[-1]["chunks"]][0] == high
    ids, done = [low, high, later], {}
    while llm.has_unfinished():
        llm.step()
        done.update({r: len(llm.step_log) for r in ids if llm.requests[r].finished and r not in done})
    assert done[high] < done[low] < done[later]  # low came back before the lower-priority newcomer
    alone = LLMEngine(llm.model, byte_tok, EngineConfig(num_blocks=64, block_size=4))
    assert llm.requests[low].seq.output_ids == alone.generate([prompt(40, 3)], greedy(8))[0].token_ids
    assert llm.blocks.num_free_blocks == 12


def test_equal_priorities_never_displace(byte_tok):
    llm = engine(byte_tok, max_num_seqs=1)
    ids, done = run(llm, {0: [(prompt(5, 6), greedy(6), 1)], 2: [(prompt(5, 7), greedy(2), 1)]})
    assert done[ids[0]] < done[ids[1]] and llm.scheduler.num_pauses == 0
