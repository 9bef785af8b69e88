"""What tensor parallelism costs and saves per decode step: measured with gloo on this machine,
computed for GPUs joined by NVLink or PCIe.

    python -m course.s07_disaggregated.tensor_parallel.bench_tensor_parallel [--model DIR] [--tp N] \
        [--threads T] [--quick] [--results | --json OUT.json]

`--results` writes stages/07_disaggregated/results/bench_tensor_parallel.json.

Measured (float32, this CPU): the same decode steps (batches of B requests, each past a 32-token
prompt) on one process with T torch threads and on N ranks of T/N threads each (gloo over
loopback); per step: its time (median), the collectives rank 0 made, their bytes and the time it
spent inside them; per rank: weight and KV pool bytes (the pool the same number of blocks).

Computed (no GPU runs here): the same step on N GPUs in bf16, reading the weights at HBM speed
(H100: 3.35 TB/s assumed) against the collectives over each link, ring all-reduce (each rank sends
2(N-1)/N of the tensor) plus a fixed latency per collective; all assumptions sit in the JSON
beside the figures. Against it, N data-parallel replicas (the whole model on each device, no
collectives): for a model that fits one device, they make N times one device's tokens.
"""
from __future__ import annotations

import torch

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.bench.measure import bench_cli, timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

from ..cli import resolve_model_dir
from .launch import TensorParallel, TPSpec
from .sharding import check_divisible, weight_bytes

HBM_BYTES_S = 3.35e12  # H100 SXM HBM3, assumed
LINKS = {"nvlink4": {"bytes_s": 450e9, "latency_s": 5e-6},   # H100 NVLink 4, per direction; assumed
         "pcie4_x16": {"bytes_s": 25e9, "latency_s": 10e-6}}  # PCIe 4.0 x16, achieved; assumed


def add_args(p) -> None:
    p.add_argument("--model", help="a model folder or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tp", type=int, help="ranks (default: the smallest N > 1 the model's heads divide by)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads in all (TP: T/N a rank)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=16, help="timed decode steps per batch")
    p.add_argument("--quick", action="store_true", help="seconds: batches 1 and 2, 4 steps")


def decode_steps(engine: LLMEngine, batch: int, steps: int, vocab: int, comm=None) -> dict:
    """Median time of `steps` decode steps of `batch` requests (their prefills untimed)."""
    params = SamplingParams(max_new_tokens=steps + 2, temperature=0, ignore_eos=True)
    for b in range(batch):
        engine.add_request([(7 * b + i) % vocab for i in range(32)], params)
    engine.step()  # every prefill (32 x batch tokens fit one step's budget)
    if comm is not None:
        comm.reset_counts()
        comm.timing = True
    times = sorted(timed(engine.step, device=engine.model.device) for _ in range(steps))
    row = {"step_s": times[len(times) // 2]}
    if comm is not None:
        comm.timing = False
        row |= {"collectives_per_step": {op: n / steps for op, n in comm.calls.items()},
                "bytes_per_step": sum(comm.bytes.values()) / steps,
                "collective_s_per_step": sum(comm.seconds.values()) / steps}
    while engine.has_unfinished():
        engine.step()
    return row


def computed(config: ModelConfig, n: int, params: int, batch: int) -> dict:
    """One bf16 decode step on N GPUs: weights read at HBM speed, collectives over each link."""
    weights = 2 * params
    one_device_s = weights / HBM_BYTES_S
    out = {"weights_bf16_bytes": weights, "one_device_step_s": one_device_s}
    reduce_bytes = batch * config.hidden_size * 2 * 2 * (n - 1) / n   # ring: 2(N-1)/N of the tensor, sent
    gather_bytes = batch * -(-config.vocab_size // n) * 2 * (n - 1)   # bf16 logits: every other rank's part
    for name, link in LINKS.items():
        collectives = 2 * config.num_hidden_layers + 1
        comm_s = collectives * (link["latency_s"] + reduce_bytes / link["bytes_s"]) + \
            link["latency_s"] + gather_bytes / link["bytes_s"]
        tp_s = one_device_s / n + comm_s
        out[name] = {"tp_step_s": tp_s, "collective_s": comm_s, "weight_read_saved_s": one_device_s * (1 - 1 / n),
                     "tp_speedup": one_device_s / tp_s,
                     "dp_over_tp_tokens": n * (batch / one_device_s) / (batch / tp_s)}  # N replicas vs one TP group
    return out


def run(args) -> dict:
    batches, steps = ([1, 2], 4) if args.quick else (args.batches, args.steps)
    model_dir = resolve_model_dir(args.model)
    config = ModelConfig.from_json(model_dir / "config.json")
    n = args.tp or next(k for k in range(2, config.num_attention_heads + 1) if _splits(config, k))
    check_divisible(config, n)
    engine_config = dict(num_blocks=64, block_size=16, max_num_batched_tokens=max(256, 32 * max(batches)))
    torch.set_num_threads(args.threads)
    loaded = load_model(model_dir)
    params = sum(p.numel() for p in {p.data_ptr(): p for p in loaded.model.parameters()}.values())
    tp1 = {"weight_bytes": weight_bytes(loaded.model)}
    rows = {}
    for b in batches:
        engine = LLMEngine(loaded.model, loaded.tokenizer, KernelEngineConfig(**engine_config), loaded.eos_token_ids)
        tp1["kv_bytes"] = engine.cache.nbytes
        rows[str(b)] = {"tp1": decode_steps(engine, b, steps, config.vocab_size)}
    del loaded, engine
    per_rank = max(1, args.threads // n)
    torch.set_num_threads(per_rank)
    with TensorParallel.start(TPSpec(n, str(model_dir), threads=per_rank)) as tp:
        shard_loaded, model = tp.load_shard()
        for b in batches:
            engine = LLMEngine(model, shard_loaded.tokenizer, KernelEngineConfig(**engine_config),
                               shard_loaded.eos_token_ids)
            ranks = [named_rank(r) for r in tp.attach(engine, log=lambda line: None)]
            rows[str(b)][f"tp{n}"] = decode_steps(engine, b, steps, config.vocab_size, tp.comm)
            rows[str(b)]["computed"] = computed(config, n, params, b)
    torch.set_num_threads(args.threads)
    return {"model": str(args.model or "SmolLM2-135M-Instruct"), "tp": n, "threads": args.threads,
            "threads_per_rank": per_rank, "memory": {"tp1": tp1, f"tp{n}": ranks}, "batches": rows,
            "assumed": {"hbm_bytes_s": HBM_BYTES_S, "links": LINKS}}


def named_rank(report: dict) -> dict:
    """A rank's memory row, named by its rank (`rank=0`) so a figure picks it by name."""
    return {"name": f"rank={report['rank']}", **report}


def _splits(config: ModelConfig, n: int) -> bool:
    try:
        check_divisible(config, n)
        return True
    except ValueError:
        return False


def report(r: dict) -> None:
    n, mib = r["tp"], 2 ** 20
    m = r["memory"]
    print(f"{r['model']}: TP=1 on {r['threads']} threads against TP={n} ({r['threads_per_rank']} a rank), gloo")
    print(f"weights: TP=1 {m['tp1']['weight_bytes'] / mib:.1f} MiB; per rank " +
          ", ".join(f"{x['weight_bytes'] / mib:.1f}" for x in m[f"tp{n}"]) + " MiB")
    print(f"KV pool: TP=1 {m['tp1']['kv_bytes'] / mib:.1f} MiB; per rank " +
          ", ".join(f"{x['kv_bytes'] / mib:.1f}" for x in m[f"tp{n}"]) + " MiB")
    print(f"{'batch':>5} {'TP=1 step':>10} {f'TP={n} step':>10} {'in collectives':>15} {'bytes/step':>11} "
          f"{'NVLink x':>9} {'PCIe x':>7} {'DP/TP':>6}")
    for b, row in r["batches"].items():
        tp, c = row[f"tp{n}"], row["computed"]
        print(f"{b:>5} {row['tp1']['step_s'] * 1e3:>8.1f}ms {tp['step_s'] * 1e3:>8.1f}ms "
              f"{tp['collective_s_per_step'] * 1e3:>13.1f}ms {tp['bytes_per_step']:>11,.0f} "
              f"{c['nvlink4']['tp_speedup']:>9.2f} {c['pcie4_x16']['tp_speedup']:>7.2f} "
              f"{c['nvlink4']['dp_over_tp_tokens']:>6.1f}")
    print("NVLink x / PCIe x: computed TP step speed-up over one GPU; DP/TP: tokens of N replicas over one TP group")


main = bench_cli(__doc__, add_args, run, report, module="course.s07_disaggregated.tensor_parallel.bench_tensor_parallel")

if __name__ == "__main__":
    main()
