"""The scheduling benchmark's real part: a small ShareGPT trace through the real engine on this
machine, at wall-clock arrival times, per policy, next to the simulator's prediction for the
same trace (how far the simulator is from reality: per-request JCT error, finishing order)."""
from __future__ import annotations

import statistics


from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.bench.workloads import arrival_times, sample_requests
from course.s04_continuous_batching.engine import EngineConfig
from course.s06_kernels_graphs.engine import KernelEngineConfig

from .cost_model import MEASURED_CPU, load
from ..engine import Engine
from ..launch.kernel_defaults import kernel_defaults
from .replay import replay
from .policies import POLICIES, make_policy
from .metrics import percentile, summarize
from .simulator import TraceRequest, simulate

SIZES = dict(num_blocks=512, block_size=16, max_num_seqs=32, max_num_batched_tokens=256)  # the server's defaults


def ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0] * len(values)
    for rank, i in enumerate(order):
        out[i] = rank
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def real_runs(loaded, n: int, load_: float, seed: int, max_output_tokens: int = 48) -> dict:
    tok, cost = loaded.tokenizer, load(MEASURED_CPU)
    requests = sample_requests(tok, n, seed, max_prompt_tokens=256, max_output_tokens=max_output_tokens)
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": r.prompt}], tokenize=False,
                                       add_generation_prompt=True), add_special_tokens=False).input_ids
           for r in requests]
    at_once = [TraceRequest(0.0, len(p), r.output_len, 0, p) for p, r in zip(ids, requests)]
    capacity = n / simulate(at_once, cost, EngineConfig(**SIZES), make_policy("fcfs")).makespan_s
    times = arrival_times(n, load_ * capacity, seed)
    trace = [TraceRequest(t, len(p), r.output_len, r.output_len.bit_length(), p)
             for t, p, r in zip(times, ids, requests)]
    short = percentile([t.output_tokens for t in trace], 25)
    out = {"requests": n, "load": load_, "rate": load_ * capacity, "max_output_tokens": max_output_tokens,
           "policies": {}}
    for policy in POLICIES:
        engine = Engine(loaded.model, tok, KernelEngineConfig(**SIZES, **kernel_defaults()),  # as served
                        loaded.eos_token_ids,
                        policy=make_policy(policy, cost))
        # an engine's first steps allocate its buffers (seconds on this CPU): not part of the trace
        engine.generate([ids[0][:16]], SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True))
        engine.scheduler.num_preemptions = engine.scheduler.num_pauses = 0
        real = replay(engine, trace, "wall")
        sim = simulate(trace, cost, EngineConfig(**SIZES), make_policy(policy, cost)).completions
        errors = [s.jct_s / r.jct_s - 1 for r, s in zip(real, sim)]
        out["policies"][policy] = {
            "real": summarize(real, cost, short), "simulated": summarize(sim, cost, short),
            "jct_error_median": statistics.median(errors), "jct_abs_error_median": statistics.median(map(abs, errors)),
            "jct_abs_error_max": max(map(abs, errors)),
            "finish_order_spearman": spearman([c.finish_s for c in real], [c.finish_s for c in sim]),
            "preemptions": engine.scheduler.num_preemptions, "pauses": engine.scheduler.num_pauses}
        r, s = out["policies"][policy]["real"], out["policies"][policy]["simulated"]
        print(f"real {policy:8s} JCT mean {r['jct_mean_s']:7.1f} s (simulated {s['jct_mean_s']:7.1f}) p99 "
              f"{r['jct_p99_s']:7.1f} (sim {s['jct_p99_s']:7.1f})  TTFT mean {r['ttft_mean_s']:6.1f} "
              f"(sim {s['ttft_mean_s']:6.1f})  per-request JCT error median "
              f"{out['policies'][policy]['jct_error_median']:+.0%}, |max| {out['policies'][policy]['jct_abs_error_max']:.0%}"
              f", finish-order Spearman {out['policies'][policy]['finish_order_spearman']:.2f}", flush=True)
    return out
