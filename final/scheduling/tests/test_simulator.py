"""The simulator is the engine's schedule without the model: on the same trace and clock, the real
engine (real forwards, sampling, blocks) finishes every request at the same step and the same
predicted time, under every policy, with preemptions; and it reproduces MLFQ's point."""
import random

import pytest

from course.final.scheduling.cost_model import load
from course.final.engine import Engine
from course.final.scheduling.replay import replay
from course.final.scheduling.policies import POLICIES, make_policy
from course.final.scheduling.simulator import TraceRequest, simulate
from course.s01_decode_loop.testing import TINY_EOS, byte_tokenizer, tiny_model
from course.s04_continuous_batching.engine import EngineConfig
from course.s06_kernels_graphs.engine import KernelEngineConfig

COST = load()  # the cost model measured on our CPU (final/results/cost_model_2core_cpu.json)
CONFIG = dict(num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=16)


def small_trace(n=14, seed=0):
    rng, t, trace = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / (2 * COST.step_time(1, 1, 16)))  # a few steps apart
        prompt = [rng.randrange(256) for _ in range(rng.choice([2, 5, 9, 17, 30]))]
        trace.append(TraceRequest(t, len(prompt), rng.choice([1, 3, 8, 20, 35]), rng.randrange(3), prompt))
    return trace


@pytest.mark.parametrize("name", POLICIES)
def test_the_simulator_reproduces_the_real_engine_schedule(name):
    trace = small_trace()
    engine = Engine(tiny_model("gqa_tied"), byte_tokenizer(), KernelEngineConfig(**CONFIG), [TINY_EOS],
                    policy=make_policy(name, COST))
    real = replay(engine, trace, "virtual", COST)
    sim = simulate(trace, COST, EngineConfig(**CONFIG), make_policy(name, COST))
    assert [c.finish_step for c in real] == [c.finish_step for c in sim.completions]
    assert [c.finish_s for c in real] == pytest.approx([c.finish_s for c in sim.completions], rel=1e-12)
    assert [c.ttft_s for c in real] == pytest.approx([c.ttft_s for c in sim.completions], rel=1e-12)
    assert [c.num_preemptions for c in real] == [c.num_preemptions for c in sim.completions]
    assert sim.preemptions > 0 and engine.scheduler.num_pauses == sim.pauses
    assert engine.blocks.num_free_blocks == CONFIG["num_blocks"]


def test_in_the_simulator_a_short_request_behind_long_ones_waits_under_fcfs_only():
    trace = [TraceRequest(0.0, 200, 300), TraceRequest(0.0, 200, 300), TraceRequest(0.1, 10, 5)]
    config = EngineConfig(num_blocks=256, block_size=16, max_num_seqs=2, max_num_batched_tokens=256)
    finish = {name: [c.finish_s for c in simulate(trace, COST, config, make_policy(name, COST)).completions]
              for name in ("fcfs", "mlfq")}
    assert finish["fcfs"][2] > max(finish["fcfs"][:2])  # behind both long ones
    assert finish["mlfq"][2] < min(finish["mlfq"][:2])  # ahead of both


def test_the_simulator_keeps_every_request_and_the_pool_whole_on_a_long_trace():
    rng = random.Random(1)
    trace = [TraceRequest(i * 0.05, rng.randint(4, 600), rng.randint(1, 400)) for i in range(300)]
    for name in POLICIES:
        result = simulate(trace, COST, EngineConfig(num_blocks=128, block_size=16), make_policy(name, COST))
        assert all(c.finish_s >= c.first_token_s >= c.arrival_s for c in result.completions)
        assert sum(c.output_tokens for c in result.completions) == sum(t.output_tokens for t in trace)
