"""Stage 07's benchmark: what disaggregation and cache-aware routing change, measured on this machine.

    OMP_NUM_THREADS=1 python -m course.s07_disaggregated.bench.benchmark [--model DIR] [--quick] \
        [--results | --json OUT.json] [--plot OUT.png]

`--results` writes stages/07_disaggregated/results/benchmark.json, which the README's figures quote.

(a) unified vs disaggregated, same two cores. One unified worker pinned to cores {0,1} (two torch
    threads) against one prefill worker pinned to core 0 and one decode worker pinned to core 1
    (one thread each), KV over gloo. Requests arrive at a fixed interval, most short, every
    `long_every`-th one long: in the unified worker a long prefill shares steps with the running
    decodes (stage 04's chunked prefill), in the split one it cannot touch them. Per request: time
    to first token (TTFT), time per output token after it (TPOT), the K/V bytes moved and how long
    the move took (the decode worker's load time, an upper bound: see the README).
(b) cache-aware vs round-robin, 2 unified replicas, one core each. Requests share a few long system
    prompts, more than one replica's pool can keep at once. Per policy: the router's prefix hit rate
    (what it believes the chosen replica has cached), the hit rate the replicas' engines measured
    (prefix_hit_tokens from /stats: the truth), and TTFT. Each policy gets fresh workers (cold caches).

The workers are pinned with os.sched_setaffinity (worker.py --cpus); this process (the clients) is
not, and shares the cores. Every topology serves one warm-up request first, not counted. Prompts
are random token ids (the content does not change the cost), generation is greedy with ignore_eos.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from course.s01_decode_loop.bench.measure import bench_cli, percentile

from ..cli import resolve_model_dir
from ..dispatcher import Dispatcher
from ..launcher import Topology


@dataclass
class Settings:
    requests: int = 16          # (a)
    short_tokens: int = 64
    long_tokens: int = 768
    long_every: int = 4
    new_tokens: int = 32
    interval_s: float = 0.5
    routed_requests: int = 32   # (b)
    systems: int = 8
    system_tokens: int = 192
    user_tokens: int = 24
    routed_new_tokens: int = 8
    routed_interval_s: float = 0.3
    replica_blocks: int = 72    # a replica's pool: room for about 5 of the 8 system prompts
    kv_blocks: int = 512        # (a)'s pools
    block_size: int = 16


QUICK = Settings(requests=4, short_tokens=12, long_tokens=40, long_every=2, new_tokens=4, interval_s=0.05,
                 routed_requests=8, systems=2, system_tokens=32, user_tokens=5, routed_new_tokens=2,
                 routed_interval_s=0.05, replica_blocks=64, kv_blocks=64)


def cores_for(n: int) -> tuple[list[str], str]:
    """One core per worker where the machine has them; the note says what was done."""
    cores = sorted(os.sched_getaffinity(0))
    pins = [str(cores[i % len(cores)]) for i in range(n)]
    return pins, f"pinned to cores {pins}" + ("" if len(cores) >= n else f" (only {len(cores)} core(s): shared)")


def kv_bytes_per_token(model_dir: Path) -> int:
    """2 (K and V) x layers x KV heads x head dim x 4 bytes (float32), from the model's config."""
    c = json.loads((model_dir / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 4


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def one_request(dispatcher: Dispatcher, prompt_ids: list[int], new_tokens: int, send_at: float) -> dict:
    """Wait for its arrival time, send it, time its tokens as the client sees them."""
    time.sleep(max(0.0, send_at - time.perf_counter()))
    start, times, last = time.perf_counter(), [], {}
    for last in dispatcher.stream(prompt_ids, {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}):
        times.append(time.perf_counter())
    return {"prompt_tokens": len(prompt_ids), "output_tokens": len(times), "ttft_s": times[0] - start,
            "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
            "kv": last.get("kv") or {}, "route": last.get("route") or {}}


def run_open_loop(dispatcher: Dispatcher, prompts: list[list[int]], new_tokens: int, interval_s: float) -> list[dict]:
    """Request i is sent at i * interval_s whatever the others do (an open loop, as users arrive)."""
    t0 = time.perf_counter() + 0.1
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ip: one_request(dispatcher, ip[1], new_tokens, t0 + ip[0] * interval_s),
                             enumerate(prompts)))


def summarize(results: list[dict]) -> dict:
    ttft, tpot = [r["ttft_s"] for r in results], [r["tpot_s"] for r in results if r["tpot_s"] is not None]
    return {"requests": len(results), "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99)}


def worker_args(s: Settings, blocks: int) -> list[str]:
    return ["--kv-blocks", str(blocks), "--block-size", str(s.block_size), "--request-timeout-s", "600"]


def part_a(model_dir: Path, s: Settings, vocab: int) -> dict:
    rng = random.Random(0)
    prompts = [random_ids(rng, s.long_tokens if i % s.long_every == s.long_every - 1 else s.short_tokens, vocab)
               for i in range(s.requests)]
    warm = random_ids(rng, s.short_tokens, vocab)
    per_token = kv_bytes_per_token(model_dir)
    report = {}
    pins, _ = cores_for(2)
    both = ",".join(dict.fromkeys(pins))  # the unified worker gets both cores (and two threads)
    for name, topo in (("unified", Topology(model_dir, 0, 0, worker_args=worker_args(s, s.kv_blocks),
                                            num_unified=1, cpus=[both])),
                       ("disaggregated", Topology(model_dir, 1, 1, worker_args=worker_args(s, s.kv_blocks),
                                                  cpus=pins))):
        with topo:
            urls = lambda ws: [w.url for w in ws]  # noqa: E731
            d = Dispatcher(urls(topo.prefill), urls(topo.decode), replicas=urls(topo.unified), block_size=s.block_size)
            one_request(d, warm, 2, 0)
            results = run_open_loop(d, prompts, s.new_tokens, s.interval_s)
            d.close()
        row = summarize(results)
        if name == "disaggregated":
            moved = [r["kv"].get("loaded_blocks", 0) * s.block_size * per_token for r in results]
            loads = [r["kv"]["load_s"] for r in results if "load_s" in r["kv"]]
            row |= {"kv_bytes_mean": statistics.fmean(moved), "kv_bytes_max": max(moved),
                    "kv_load_p50_s": percentile(loads, 50), "kv_load_p99_s": percentile(loads, 99)}
        row["cores"] = f"cores {both}" if name == "unified" else f"prefill on core {pins[0]}, decode on core {pins[1]}"
        report[name] = row
    return report


def part_b(model_dir: Path, s: Settings, vocab: int) -> dict:
    rng = random.Random(1)
    systems = [random_ids(rng, s.system_tokens, vocab) for _ in range(s.systems)]
    prompts = [rng.choice(systems) + random_ids(rng, s.user_tokens, vocab) for _ in range(s.routed_requests)]
    warm = random_ids(rng, s.user_tokens, vocab)
    pins, _ = cores_for(2)
    report = {}
    for policy in ("cache_aware", "round_robin"):
        with Topology(model_dir, 0, 0, worker_args=worker_args(s, s.replica_blocks), num_unified=2, cpus=pins) as topo:
            d = Dispatcher(replicas=[w.url for w in topo.unified], policy=policy, block_size=s.block_size,
                           router_options={"max_tree_tokens": s.replica_blocks * s.block_size})  # forget as they do
            one_request(d, warm, 1, 0)
            hits = lambda: sum(httpx.get(f"{w.url}/stats").json()["prefix_hit_tokens"] for w in topo.unified)  # noqa: E731
            before, router_before = hits(), d.first.stats.as_dict()
            results = run_open_loop(d, prompts, s.routed_new_tokens, s.routed_interval_s)
            engine_hits, router = hits() - before, d.first.stats.as_dict()
            d.close()
        prompt_tokens = sum(len(p) for p in prompts)
        report[policy] = summarize(results) | {
            "router_prefix_hit_rate": (router["matched_tokens"] - router_before["matched_tokens"]) / prompt_tokens,
            "engine_prefix_hit_rate": engine_hits / prompt_tokens,
            "per_replica": sorted(Counter(r["route"]["replica"] for r in results).values(), reverse=True)}
    return report


def print_tables(report: dict) -> None:
    a, b = report["a"], report["b"]
    ms = lambda x: f"{1000 * x:8.1f}" if x == x else "     n/a"  # noqa: E731 (NaN: no sample)
    print(f"\n(a) {report['settings']['requests']} requests, 1 in {report['settings']['long_every']} long "
          f"({report['settings']['long_tokens']} tokens, else {report['settings']['short_tokens']})")
    print(f"{'':15}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'TPOT p99':>10}   (ms)  cores")
    for name, r in a.items():
        print(f"{name:15}{ms(r['ttft_p50_s'])}  {ms(r['ttft_p99_s'])}  {ms(r['tpot_p50_s'])}  {ms(r['tpot_p99_s'])}"
              f"         {r['cores']}")
    dis = a["disaggregated"]
    print(f"K/V moved per request: mean {dis['kv_bytes_mean'] / 2**20:.2f} MiB, max {dis['kv_bytes_max'] / 2**20:.2f} MiB;"
          f" load time p50 {ms(dis['kv_load_p50_s']).strip()} ms, p99 {ms(dis['kv_load_p99_s']).strip()} ms")
    print(f"\n(b) {report['settings']['routed_requests']} requests over {report['settings']['systems']} system prompts,"
          " 2 replicas")
    print(f"{'':15}{'router hit':>11}{'engine hit':>11}{'TTFT p50':>10}{'TTFT p99':>10}  per replica")
    for name, r in b.items():
        print(f"{name:15}{r['router_prefix_hit_rate']:>10.0%} {r['engine_prefix_hit_rate']:>10.0%} "
              f"{ms(r['ttft_p50_s'])}  {ms(r['ttft_p99_s'])}  {r['per_replica']}")


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    keys = ["ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"]
    for i, (name, r) in enumerate(report["a"].items()):
        ax1.bar([k + i * 0.4 for k in range(4)], [1000 * r[k] for k in keys], 0.4, label=name)
    ax1.set_xticks([k + 0.2 for k in range(4)], ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"])
    ax1.set_ylabel("ms"), ax1.set_title("(a) unified vs disaggregated"), ax1.legend()
    for i, (name, r) in enumerate(report["b"].items()):
        ax2.bar([k + i * 0.4 for k in range(2)], [r["engine_prefix_hit_rate"], r["ttft_p50_s"]], 0.4, label=name)
    ax2.set_xticks([0.2, 1.2], ["engine prefix hit rate", "TTFT p50 (s)"])
    ax2.set_title("(b) routing over 2 replicas"), ax2.legend()
    fig.tight_layout()
    fig.savefig(path)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder or .gguf (default: the course's default model)")
    p.add_argument("--quick", action="store_true", help="a tiny run that only checks the benchmark works")
    p.add_argument("--plot", help="also draw the figure here (needs matplotlib)")


def run(args: argparse.Namespace) -> dict:
    s = QUICK if args.quick else Settings()
    model_dir = resolve_model_dir(args.model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    report = {"cpus": sorted(os.sched_getaffinity(0)), "model": str(model_dir), "settings": asdict(s),
              "quick": args.quick}
    report["a"] = part_a(model_dir, s, vocab)
    report["b"] = part_b(model_dir, s, vocab)
    if args.plot:
        plot(report, args.plot)
    return report


main = bench_cli(__doc__, add_args, run, print_tables, module="course.s07_disaggregated.bench.benchmark")


if __name__ == "__main__":
    main()
