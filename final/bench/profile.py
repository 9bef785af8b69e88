"""Where a step's time goes: a wall-clock breakdown of `Engine.step()` per phase.

    python -m course.final.bench.profile                       # all three workloads, the server's defaults
    python -m course.final.bench.profile --workload single --torch-profiler   # + torch's top ops
    python -m course.final.bench.profile --attention-backend torch --json out.json   # one option changed
    python -m course.final.bench.profile --results     # writes final/results/profile.json

Workloads (the default model, greedy, EOS ignored, as bench/peers.py measures them):
  single     one chat request, 128 new tokens: the single-stream decode step
  saturated  40 ShareGPT requests at once (answers capped at 128 tokens): the light serving load
  standard   vLLM's ShareGPT benchmark (standard_load.py): 40 raw prompts of ~236 tokens at once,
             128 tokens each: the prefill-heavy serving load

Each workload runs twice, on fresh engines: bare, for the step time quoted, then with the
phases timed by wrapping the functions that do them (on the CPU every op is synchronous, so a
wall clock around a call is the call's cost; the wrappers add a few us per call):
  schedule     the scheduler's pick of (request, tokens) pairs
  prepare      host lists -> the runner's persistent buffers and the backend's metadata
  linear       every nn.Linear of the decoder (the GEMVs / GEMMs: the part bounded by the machine)
  attention    the attention backend (KV write + attention), all layers
  layer calls  stage 06's one-call layers (the CPU backend's, cpu/layer.py): the matrix products and
               everything between them, one C call per layer
  other fwd    the rest of the forward: embedding, norms, RoPE, SiLU, residual adds
  lm_head      logits of the sampling rows
  sample       the batched sampler
  postprocess  the rest of the step: commits to the block manager, appends, detokenizing, finishing

`step within N x its GEMVs` is the step's time over the time of its
matrix products alone: every weight of one step (decoder linears and lm_head) multiplied by as
many rows as the step has, back to back, outside the engine, by the fastest of torch's split
`bmm`, MKL's sgemm and stage 06's C kernel (`gemv_floor`). Without one-call layers
`step / linear` is printed too.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import sample_requests
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s06_kernels_graphs.cpu.int8_linear import Int8Linear
from course.s06_kernels_graphs.cpu.bench_cpu_kernels import time_products
from course.s06_kernels_graphs.cpu.layer import LayerCalls, layer_weight
from course.s06_kernels_graphs.cpu.split_linear import SplitLinear

from ..engine import Engine
from .standard_load import standard_requests
from ..launch.kernel_defaults import kernel_defaults
from ..launch.sizing import BUDGET, SEQS

PHASES = ("schedule", "prepare", "linear", "attention", "layer calls", "other fwd", "lm_head", "sample", "postprocess")
SINGLE_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


class PhaseClock:
    """Accumulates seconds per phase. `wrap(obj, name, phase)` times every call of obj.name;
    nested phases are subtracted from their parent at report time (see `breakdown`)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)

    @contextmanager
    def phase(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t
            self.calls[name] += 1

    def wrap(self, obj, attr: str, name: str) -> None:
        inner = getattr(obj, attr)

        def timed(*args, **kwargs):
            with self.phase(name):
                return inner(*args, **kwargs)

        setattr(obj, attr, timed)


def instrument(engine: Engine, clock: PhaseClock) -> None:
    """Wrap the engine's parts with the clock (instance attributes shadow the methods)."""
    import course.s04_continuous_batching.engine as batching

    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(engine.runner, "prepare", "prepare")
    clock.wrap(engine.runner.backend, "forward", "attention")
    model = engine.runner.model
    clock.wrap(model, "forward", "forward")
    clock.wrap(model, "compute_logits", "lm_head")
    for module in model.modules():
        if isinstance(module, (nn.Linear, SplitLinear, Int8Linear)) and module is not getattr(model, "lm_head", None):
            clock.wrap(module, "forward", "linear")
    clock.wrap(engine, "step", "step")
    # Two parts live outside the engine, so their wrappers are undone by uninstrument(): the
    # one-call layers (made per forward: timed on the class) and the batched sampler (the
    # module-level name _postprocess calls).
    for owner, attr, name in ((LayerCalls, "run", "layer calls"), (batching, "sample_batch", "sample")):
        _PATCHED.append((owner, attr, owner.__dict__[attr]))
        clock.wrap(owner, attr, name)


_PATCHED: list[tuple[object, str, object]] = []  # (owner, attribute, what it held before instrument)


def uninstrument() -> None:
    """Put back what instrument() wrapped outside the engine."""
    while _PATCHED:
        owner, attr, original = _PATCHED.pop()
        setattr(owner, attr, original)


def gemv_floor(model, rows: int = 1, reps: int = 7) -> dict[str, float] | None:
    """Seconds for one step's matrix products alone (every decoder weight and the lm_head times
    `rows` rows, back to back): stage 06's C product, and MKL's sgemm and torch's split bmm
    where the weights are float32.
    None for a model whose linears the C does not take (bf16, biases)."""
    layers = getattr(model, "layers", None)
    weights = [layer_weight(lin) for layer in layers or [] for lin in (layer.qkv, layer.o_proj, layer.gate_up,
                                                                       layer.down_proj)]
    weights.append(layer_weight(model.lm_head) if layers else None)
    if not layers or any(w is None for w in weights):
        return None
    seconds = time_products(weights, rows, reps)
    names = {"C": "C kernel", "MKL": "MKL sgemm", "bmm": "torch bmm"}
    return {names[way]: t for way, t in seconds.items()}


def breakdown(clock: PhaseClock) -> dict[str, float]:
    """Seconds per phase, exclusive: the forward minus what ran inside it, the step minus all."""
    s = clock.seconds
    out = {"schedule": s["schedule"], "prepare": s["prepare"], "linear": s["linear"],
           "attention": s["attention"], "layer calls": s["layer calls"],
           "other fwd": s["forward"] - s["linear"] - s["attention"] - s["layer calls"],
           "lm_head": s["lm_head"], "sample": s["sample"]}
    out["postprocess"] = s["step"] - sum(out.values())
    return out


def kernel_settings(args) -> dict:
    """The server's defaults on this CPU, with the options given on the command line."""
    return kernel_defaults("cpu", getattr(torch, args.dtype), attention_backend=args.attention_backend,
                           fused=args.fused, linear_splits=args.linear_splits, quantization=args.quantization)


def build_engine(loaded, args) -> Engine:
    config = KernelEngineConfig(num_blocks=args.kv_blocks, max_num_seqs=args.max_num_seqs,
                                max_num_batched_tokens=args.max_num_batched_tokens, record_steps=False,
                                one_call_layers=args.one_call_layers,
                                kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"), **kernel_settings(args))
    return Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids, prefetch_masks=False)


def workload(loaded, name: str) -> list[tuple[list[int], SamplingParams]]:
    tok = loaded.tokenizer
    if name == "single":
        return [(encode_prompt(tok, SINGLE_PROMPT, chat=True),
                 SamplingParams(max_new_tokens=128, temperature=0, ignore_eos=True))]
    if name == "standard":  # raw completion prompts, as vLLM's benchmark client sends them
        return [(tok.encode(prompt, add_special_tokens=False),
                 SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)) for prompt, n in standard_requests(tok)]
    reqs = sample_requests(tok, 40, seed=0, max_prompt_tokens=512, max_output_tokens=128)
    return [(encode_prompt(tok, r.prompt, chat=True), SamplingParams(max_new_tokens=r.output_len, temperature=0,
                                                                     ignore_eos=True)) for r in reqs]


def warm_engine(loaded, args) -> Engine:
    engine = build_engine(loaded, args)
    engine.generate([encode_prompt(loaded.tokenizer, "Hi", chat=True)], SamplingParams(max_new_tokens=4, temperature=0))
    return engine


def run_workload(engine: Engine, work) -> tuple[int, float]:
    """(steps, seconds) to serve `work` from an idle engine."""
    for prompt, params in work:
        engine.add_request(prompt, params)
    steps, t = 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps, time.perf_counter() - t


def profile(loaded, args, name: str) -> dict:
    """The workload twice, each on a fresh engine (no cached prefix carried over): bare for the
    step time (the figures quoted), then with the phase clock's wrappers (a few us each, ~40 a
    step) for the breakdown."""
    work = workload(loaded, name)
    steps, wall = run_workload(warm_engine(loaded, args), work)
    engine, clock = warm_engine(loaded, args), PhaseClock()
    instrument(engine, clock)
    _, instrumented_wall = run_workload(engine, work)
    uninstrument()
    phases = breakdown(clock)
    floor = gemv_floor(engine.runner.model, rows=1) if name == "single" else None
    prompt_tokens = sum(len(p) for p, _ in work)
    output_tokens = sum(p.max_new_tokens for _, p in work)
    return {"name": name, "workload": name, "requests": len(work), "steps": steps, "seconds": wall,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
            "output_tok_s": output_tokens / wall, "total_tok_s": (prompt_tokens + output_tokens) / wall,
            "ms_per_step": 1e3 * wall / steps, "instrumented_ms_per_step": 1e3 * instrumented_wall / steps,
            "phases_s": phases,
            "step_over_linear": clock.seconds["step"] / phases["linear"] if not phases["layer calls"] else None,
            "gemv_floor_s": floor, "step_over_gemvs": wall / steps / min(floor.values()) if floor else None}


def torch_profile(loaded, args, name: str, top: int) -> str:
    """torch.profiler's table of the ops that took the most self CPU time over the workload."""
    from torch.profiler import ProfilerActivity, profile as torch_profiler

    engine = build_engine(loaded, args)
    for prompt, params in workload(loaded, name):
        engine.add_request(prompt, params)
    with torch_profiler(activities=[ProfilerActivity.CPU]) as prof:
        while engine.has_unfinished():
            engine.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def print_result(r: dict) -> None:
    print(f"\n{r['workload']}: {r['requests']} requests, {r['steps']} steps, {r['seconds']:.1f} s, "
          f"{r['ms_per_step']:.1f} ms/step, {r['output_tok_s']:.1f} output tok/s, "
          f"{r['total_tok_s']:.1f} prompt+output tok/s"
          + (f"; step = {r['step_over_linear']:.2f} x its linears" if r["step_over_linear"] else ""))
    if r["gemv_floor_s"]:
        ways = ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in r["gemv_floor_s"].items())
        print(f"  its matrix products alone: {ways}; step = {r['step_over_gemvs']:.2f} x the fastest")
    total = sum(r["phases_s"].values())
    for phase in PHASES:
        s = r["phases_s"][phase]
        print(f"  {phase:>12} {1e3 * s / r['steps']:8.2f} ms/step {100 * s / total:5.1f}%")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=["single", "saturated", "standard", "all"], default="all")
    p.add_argument("--attention-backend", choices=["torch", "cpu"], help="default: the server's (cpu where it compiles)")
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, help="stage 06's merged projections and fused ops")
    p.add_argument("--linear-splits", type=int, help="stage 06's split linears (default: the thread count)")
    p.add_argument("--quantization", choices=["int8"], help="stage 06's int8 weight-only linears (implies --fused)")
    p.add_argument("--one-call-layers", action=argparse.BooleanOptionalAction, default=True,
                   help="stage 06's one C call per layer")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-dtype", default="auto", help="what the KV cache stores (serve's flag)")
    p.add_argument("--max-num-seqs", type=int, default=SEQS, help="default: the CPU server's (launch/sizing.py)")
    p.add_argument("--max-num-batched-tokens", type=int, default=BUDGET)
    p.add_argument("--kv-blocks", type=int, default=2048, help="default: every request of a workload at once")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--torch-profiler", action="store_true", help="also print torch.profiler's top ops")
    p.add_argument("--top", type=int, default=15)


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(dtype=getattr(torch, args.dtype))
    names = ["single", "saturated", "standard"] if args.workload == "all" else [args.workload]
    results = []
    for name in names:
        results.append(profile(loaded, args, name))
        if args.torch_profiler:
            print(torch_profile(loaded, args, name, args.top))
    return {**kernel_settings(args), "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype, "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens, "results": results}


def report(result: dict) -> None:
    for r in result["results"]:
        print_result(r)


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.profile")

if __name__ == "__main__":
    main()
