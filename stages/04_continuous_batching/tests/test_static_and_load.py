"""The static-batching baseline and the load benchmark's pieces."""
import math

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s01_decode_loop.bench.workloads import arrival_times
from course.s04_continuous_batching.bench.benchmark import serve, summarize
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.static_batching import StaticBatchScheduler

PROMPTS = [[5] * 3, [6] * 20, [7] * 9, [8] * 14, [9] * 2]
OUTS = [12, 3, 7, 1, 5]


def greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def test_static_batching_admits_only_into_an_empty_batch(byte_tok):
    model = tiny_model("gqa_tied")
    config = EngineConfig(max_num_seqs=2, max_num_batched_tokens=512, enable_chunked_prefill=False)
    static = LLMEngine(model, byte_tok, config, scheduler_cls=StaticBatchScheduler)
    outs = static.generate(PROMPTS, [greedy(n) for n in OUTS])
    batches = [(i, {rid for rid, _, computed in step["chunks"] if computed == 0})
               for i, step in enumerate(static.step_log)]
    batches = [(i, ids) for i, ids in batches if ids]
    assert [ids for _, ids in batches] == [{0, 1}, {2, 3}, {4}]
    for (_, prev), (j, _) in zip(batches, batches[1:]):
        later = {rid for step in static.step_log[j:] for rid, _, _ in step["chunks"]}
        assert not prev & later, "a batch started before the previous one had finished"
    continuous = LLMEngine(model, byte_tok, config)
    same = continuous.generate(PROMPTS, [greedy(n) for n in OUTS])
    assert [o.token_ids for o in outs] == [o.token_ids for o in same]
    assert len(static.step_log) > len(continuous.step_log)  # waiting for the longest costs steps


def test_load_poisson_arrivals_are_seeded_and_increasing():
    a, b = arrival_times(50, 2.0, seed=1), arrival_times(50, 2.0, seed=1)
    assert a == b and all(x < y for x, y in zip(a, a[1:]))
    assert 15 < a[-1] < 40  # 50 arrivals at 2/s take ~25 s
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]


def test_load_serve_counts_latency_from_arrival(byte_tok):
    engine = LLMEngine(tiny_model("gqa_tied"), byte_tok)
    work = [(p, n) for p, n in zip(PROMPTS, OUTS)]
    metrics = serve(engine, work, arrival_times(len(work), 50.0))
    assert [m["tokens"] for m in metrics] == OUTS
    assert all(m["e2e_s"] >= m["ttft_s"] >= m["queue_s"] >= 0 for m in metrics)
    row = summarize("x", 50.0, metrics, wall=2.0)
    assert row["output_tok_s"] == sum(OUTS) / 2.0 and row["ttft_p50"] <= row["ttft_p99"]
