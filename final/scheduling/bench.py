"""FCFS vs priority vs Skip-Join MLFQ on ShareGPT traces, in the simulator at several loads, and
(with --real) a small real run on this machine that also checks the simulator's predictions.

    python -m course.final.scheduling.bench --requests 10000 --results --plot final/results/scheduling.png
    python -m course.final.scheduling.bench --requests 0 --real 24 --json real.json

Load = arrival rate / FCFS's throughput on the same requests all at once. Two cost models: the one
measured on our CPU with the engine's default sizes, and a GPU-like one (derived, not measured:
see cost_model.gpu_like) with vLLM-like sizes. "priority" is an oracle: each request's priority
is log2 of its true answer length (shortest-job-first by buckets), a bound that MLFQ, which does
not know the lengths, tries to approach.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from course.s01_decode_loop.bench.measure import bench_cli
from course.s04_continuous_batching.engine import EngineConfig

from .cost_model import MEASURED_CPU, gpu_like, load
from .policies import POLICIES, MLFQConfig, make_policy
from .metrics import percentile, quantiles, summarize
from .simulator import TraceRequest, simulate
from .traces import poisson_trace, sharegpt_lengths

SETUPS = {  # cost model, engine sizes, MLFQ quanta
    "cpu (measured)": (lambda: load(MEASURED_CPU), EngineConfig(num_blocks=512, block_size=16, max_num_seqs=32,
                                                                max_num_batched_tokens=256), MLFQConfig()),
    "gpu-like (derived)": (gpu_like, EngineConfig(num_blocks=6900, block_size=16, max_num_seqs=256,
                                                  max_num_batched_tokens=2048), MLFQConfig(base_quantum_s=0.010)),
}


def run_name(setup: str, load_: float, policy: str) -> str:
    """A simulated run's name, e.g. "cpu/load=0.9/mlfq" (the README's keys pick runs by it)."""
    return f"{setup.split()[0]}/load={load_:g}/{policy}"


def with_priorities(trace: list[TraceRequest]) -> list[TraceRequest]:
    for t in trace:
        t.priority = t.output_tokens.bit_length()  # the oracle: shorter answers first, by powers of two
    return trace


def capacity(lengths, cost, config) -> float:
    """FCFS throughput (requests/s) with everything queued at once: what load 1.0 means."""
    sample = lengths[:2000]
    return len(sample) / simulate(poisson_trace(sample, float("inf")), cost, config, make_policy("fcfs")).makespan_s


def simulated_runs(lengths, loads: list[float], seed: int, setups: list[str], policies: list[str],
                   starvation_s: float | None = None, num_blocks: int | None = None) -> list[dict]:
    short = percentile([o for _, o in lengths], 25)
    runs = []
    for name in setups:
        make_cost, config, mlfq = SETUPS[name]
        mlfq = MLFQConfig(mlfq.base_quantum_s, mlfq.ratio, mlfq.num_levels, starvation_s)
        if num_blocks:  # a bigger pool is what swapping to host RAM buys on a CPU (see the README)
            config = dataclasses.replace(config, num_blocks=num_blocks)
        cost = make_cost()
        full = capacity(lengths, cost, config)
        for load_ in loads:
            for policy in policies:
                trace = with_priorities(poisson_trace(lengths, load_ * full, seed))
                start = time.perf_counter()
                result = simulate(trace, cost, config, make_policy(policy, cost, mlfq))
                wall = time.perf_counter() - start
                runs.append({"name": run_name(name, load_, policy), "cost_model": name, "num_blocks": config.num_blocks,
                             "load": load_, "rate": load_ * full, "policy": policy,
                             "summary": summarize(result.completions, cost, short), "steps": result.steps,
                             "preemptions": result.preemptions, "pauses": result.pauses, "sim_seconds": wall,
                             "jct_quantiles_s": quantiles([c.jct_s for c in result.completions])})
                s = runs[-1]["summary"]
                print(f"{name:19s} load {load_:.2f} {policy:8s} JCT mean {s['jct_mean_s']:9.1f} p99 "
                      f"{s['jct_p99_s']:9.1f}  TTFT mean {s['ttft_mean_s']:8.1f} p99 {s['ttft_p99_s']:8.1f}  "
                      f"short stuck {s['short_stuck_frac']:5.1%}  preempt {result.preemptions:6d} "
                      f"pause {result.pauses:6d}  makespan {result.makespan_s:7.0f} s  ({wall:.1f} s)", flush=True)
    return runs


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=10000, help="ShareGPT requests per simulated trace (0: none)")
    p.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    p.add_argument("--real", type=int, default=0, help="also run this many requests through the real engine")
    p.add_argument("--real-load", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--mlfq-starvation", type=float, help="seconds (default: MLFQConfig's)")
    p.add_argument("--num-blocks", type=int, help="KV pool size of the simulated engine (default: the setup's)")
    p.add_argument("--plot")


def run(args: argparse.Namespace) -> dict:
    """The simulated runs (and the real ones); each run's line is printed as it finishes."""
    from course.s01_decode_loop.weights import load_model

    loaded = load_model()
    result = {"requests": args.requests, "loads": args.loads, "seed": args.seed,
              "mlfq_starvation_s": args.mlfq_starvation, "num_blocks": args.num_blocks}
    if args.requests:
        start = time.perf_counter()
        lengths = sharegpt_lengths(loaded.tokenizer, args.requests, args.seed)
        print(f"{len(lengths)} ShareGPT requests in {time.perf_counter() - start:.1f} s: prompt mean "
              f"{sum(p for p, _ in lengths) / len(lengths):.0f}, answer mean {sum(o for _, o in lengths) / len(lengths):.0f}"
              f" p50 {percentile([o for _, o in lengths], 50):.0f} p99 {percentile([o for _, o in lengths], 99):.0f}")
        result["simulated"] = simulated_runs(lengths, args.loads, args.seed, args.setups, args.policies,
                                             args.mlfq_starvation, args.num_blocks)
        if args.plot:
            import matplotlib
            matplotlib.use("Agg")
            from .plots import plot_runs
            plot_runs(result["simulated"]).savefig(args.plot, dpi=110)
    if args.real:
        from .bench_real import real_runs
        result["real"] = real_runs(loaded, args.real, args.real_load, args.seed)
    return result


def report(result: dict) -> None:
    print(f"{len(result.get('simulated', []))} simulated runs, {len(result.get('real', []))} real runs")


main = bench_cli(__doc__, add_args, run, report, module="course.final.scheduling.bench")

if __name__ == "__main__":
    main()
