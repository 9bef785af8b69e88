"""The engine as the server builds it, step by step, on random weights: where a step's time goes.

    python -m course.final.bench.gpu_engine [--models 1b 8b] [--workloads decode prefill speculation]
                                            [--json final/results/gpu_engine_h100.json]
    python -m course.final.bench.gpu_engine --dry-run     # a tiny model on the CPU, a few steps: the plumbing

On a lent GPU machine it runs as a part of `bash final/gpu_serve_check.sh OUTDIR engine`; its
file is named for the card (h100, h200) in final/results/.

Models: random weights in Llama-3.2-1B's shape and in Llama-3.1-8B's (configs from transformers'
own LlamaConfig, nothing downloaded; speed depends on the shapes, not the values), the byte-level
tokenizer, the engine with the server's kernel choices for the device (launch/kernel_defaults.py:
bfloat16, Triton, fused ops and graphs captured before the first step on CUDA) and its default
step budget; the KV pool is sized for the workload (the server sizes it from the card's free
memory), graphs cover sequences up to its length, as the server's do. Workloads, every request greedy with a fixed output length (EOS ignored):

  decode       64 streams, 128-token prompts, 256 new tokens each
  prefill      16 prompts of 2,048 tokens, 8 new tokens each
  speculation  1 and 16 streams, 256 new tokens, no drafter against an oracle drafter with k=4
               (it proposes the tokens the no-drafter run emitted: acceptance 100% where the
               verifying forward computes the same argmax; the measured rate is stored)

Per step: wall time (the step as the engine thread runs it: schedule, launch, sample, read the
tokens, detokenize), device time (CUDA events around ModelRunner.run: the forward's inputs, kernels
or graph replay, and logits), exposed host time (the device's idle gap between one forward's end and
the next one's start: the host work the device waited on, the sampling kernels included), and
whether the forward replayed a captured graph. The events are read after the run, so timing adds
no sync. The decode workload runs twice: the synchronous step ("sync") and overlap scheduling
("overlap", the next step launched before the last one's tokens are read; the server's default on
CUDA). Each row: steps, graphed steps, medians per step of the three times by kind of step
(decode-only or mixed), output tok/s, and the served rate against the device's (device time over
wall time, summed over decode-only steps). On the CPU "device time" is the forward's own wall time.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.bench.measure import bench_cli, write_json
from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer
from course.s05_speculative.drafter import Draft, Drafter
from course.s06_kernels_graphs.engine import KernelEngineConfig

from ..engine import Engine, SpeculativeConfig
from ..launch.kernel_defaults import describe, kernel_defaults, pick_device, pick_dtype

BLOCK = 16
BUDGET = 256  # the server's --max-num-batched-tokens default


def llama_config(name: str):
    """transformers' LlamaConfig in a real model's shape (no download)."""
    from transformers import LlamaConfig

    shapes = {
        "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                   rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    }
    return LlamaConfig(rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                       bos_token_id=128000, eos_token_id=128001, **shapes[name])


@torch.no_grad()
def random_model(shape: str | ModelConfig, device: str, dtype: torch.dtype, seed: int = 0) -> CausalLM:
    """Random weights drawn on the device (an 8B model's float32 draw on the host would take minutes):
    norms near 1, matrices small, as stage 01's init_random_weights. `shape`: 1b, 8b, tiny or a config."""
    config = shape if isinstance(shape, ModelConfig) else \
        TINY_CONFIGS["gqa_tied"] if shape == "tiny" else ModelConfig.from_hf(llama_config(shape))
    torch.manual_seed(seed)
    with torch.device(device):
        model = CausalLM(config)
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.1 if "embed" in pname else 0.02)
    return model.to(dtype).eval()


class OracleDrafter(Drafter):
    """Proposes the next k tokens of a reference run of the same prompt: every draft is what the
    target emits (where the verifying forward picks the same argmax), so acceptance is 100%."""
    name = "oracle"

    def __init__(self, reference: dict[tuple[int, ...], list[int]]):
        self.reference = reference

    def propose(self, seq, k: int) -> Draft:
        ref, done = self.reference.get(tuple(seq.prompt_ids), []), len(seq.output_ids)
        if done and (done > len(ref) or ref[done - 1] != seq.output_ids[-1]):
            return Draft([])  # the run left the reference: nothing left to know
        return Draft(ref[done:done + k])


class StepTimer:
    """Wraps an engine's ModelRunner.run to time every forward on the device, without a sync:
    CUDA events are read once the run is over (a sync per step would undo overlap scheduling)."""

    def __init__(self, engine):
        self.runner, self.cuda = engine.runner, engine.runner.model.device.type == "cuda"
        self.run, self.marks = self.runner.run, []
        self.runner.run = self  # an instance attribute: the engine calls this instead

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, token_ids, seqs, sample_rows, feed=None, trees=None, groups=None):
        kind = "decode" if all(n == 1 for _, n, _ in seqs) else "mixed"
        start = self.now()
        out = self.run(token_ids, seqs, sample_rows, feed, trees, groups)
        self.marks.append((kind, out.graphed, start, self.now()))
        return out

    def forwards(self) -> list[dict]:
        """Per forward: its kind, graphed, device ms, and the device's idle gap before it (ms):
        the host time it was exposed to (the sampling kernels of the step before included)."""
        if self.cuda:
            torch.cuda.synchronize()
        ms = (lambda a, b: a.elapsed_time(b)) if self.cuda else (lambda a, b: (b - a) * 1e3)
        out, previous_end = [], None
        for kind, graphed, start, end in self.marks:
            out.append({"kind": kind, "graphed": bool(graphed), "device_ms": ms(start, end),
                        "host_ms": None if previous_end is None else ms(previous_end, start)})
            previous_end = end
        return out


def build_engine(model, tok, options: dict, streams: int, num_blocks: int, spec=None, drafter=None) -> Engine:
    config = KernelEngineConfig(num_blocks=num_blocks, block_size=BLOCK, max_num_seqs=streams,
                                max_num_batched_tokens=max(BUDGET, streams), max_waiting=max(256, streams),
                                record_steps=False, graph_max_seq_len=num_blocks * BLOCK,
                                graph_max_num_tokens=512, **options)
    engine = Engine(model, tok, config, [], spec, drafter=drafter)
    engine.warm_up()  # every graph bucket captured (and Triton compiled) before the first step, as the server does
    return engine


def serve(engine, prompts: list[list[int]], new_tokens: int) -> tuple[list[dict], list[list[int]]]:
    """Every prompt at once, stepped to the end; one record per forward, and the outputs."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    timer = StepTimer(engine)
    ids = [engine.add_request(p, params) for p in prompts]
    walls, tokens = [], []
    while engine.has_unfinished():
        launched = len(timer.marks)
        t0 = time.perf_counter()
        outputs = engine.step()
        if len(timer.marks) > launched:  # a step that ran a forward (the last one may only read tokens)
            walls.append((time.perf_counter() - t0) * 1e3)
            tokens.append(sum(o.event is not None for o in outputs))
        elif tokens:
            tokens[-1] += sum(o.event is not None for o in outputs)
    steps = [f | {"wall_ms": w, "tokens": n} for f, w, n in zip(timer.forwards(), walls, tokens)]
    return steps, [engine.requests[i].seq.output_ids for i in ids]


def summarize(steps: list[dict]) -> dict:
    row = {"steps": len(steps), "graphed_steps": sum(s["graphed"] for s in steps),
           "wall_s": sum(s["wall_ms"] for s in steps) / 1e3, "tokens": sum(s["tokens"] for s in steps)}
    row["tok_s"] = row["tokens"] / row["wall_s"] if row["wall_s"] else 0.0
    for kind in ("decode", "mixed"):
        some = [s for s in steps if s["kind"] == kind]
        row[f"{kind}_steps"] = len(some)
        for key in ("wall_ms", "device_ms", "host_ms"):
            values = [s[key] for s in some if s[key] is not None]
            row[f"{kind}_{key}_p50"] = statistics.median(values) if values else None
    decode = [s for s in steps if s["kind"] == "decode"]
    wall = sum(s["wall_ms"] for s in decode)
    row["decode_device_over_wall"] = sum(s["device_ms"] for s in decode) / wall if wall else None
    return row


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, length), generator=g).tolist()  # bytes: the tokenizer decodes them


WORKLOADS = {  # name -> (streams, prompt length, new tokens); the dry run shrinks them
    "decode": [(64, 128, 256)], "prefill": [(16, 2048, 8)], "speculation": [(1, 128, 256), (16, 128, 256)]}
DRY = {"decode": [(4, 8, 6)], "prefill": [(2, 40, 2)], "speculation": [(1, 8, 6), (2, 8, 6)]}


def run_workload(name: str, model, tok, options: dict, workload: str, streams: int, prompt_len: int, new_tokens: int,
                 k: int, seed: int) -> list[dict]:
    prompts = random_prompts(streams, prompt_len, seed)
    blocks = streams * -(-(prompt_len + new_tokens + k + 1) // BLOCK) + 8
    shape = {"model": name, "workload": workload, "streams": streams, "prompt_len": prompt_len, "new_tokens": new_tokens}
    systems = {"none": None}
    rows, reference = [], None
    if workload == "decode":
        systems = {"sync": {"overlap": False}, "overlap": {"overlap": True}}
    if workload == "speculation":
        systems["oracle k=%d" % k] = "oracle"
    for system, settings in systems.items():
        if settings == "oracle":
            drafter = OracleDrafter({tuple(p): out for p, out in zip(prompts, reference)})
            engine = build_engine(model, tok, options, streams, blocks, SpeculativeConfig("none", k), drafter)
        else:
            engine = build_engine(model, tok, options | (settings or {}), streams, blocks)
        start = time.perf_counter()
        steps, outputs = serve(engine, prompts, new_tokens)
        row = shape | {"system": system, "run_s": time.perf_counter() - start} | summarize(steps)
        if settings == "oracle":
            row |= {"acceptance_rate": engine.spec_stats.acceptance_rate,
                    "mean_accepted_length": engine.spec_stats.mean_accepted_length,
                    "same_tokens_as_none": outputs == reference,
                    "vs_none": row["tok_s"] / rows[0]["tok_s"]}
        if system == "overlap":
            row |= {"same_tokens_as_sync": outputs == reference, "vs_sync": row["tok_s"] / rows[0]["tok_s"]}
        reference = reference or outputs
        row["engine_graphed_steps"] = engine.graphed_steps
        row["per_step"] = {key: [s[key] for s in steps] for key in steps[0]} if steps else {}
        rows.append(row)
        print(line(row))
        del engine
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def line(r: dict) -> str:
    def ms(x):
        return "     -" if x is None else f"{x:6.2f}"
    text = (f"{r['model']:4s} {r['workload']:11s} {r['streams']:3d}x{r['prompt_len']:<5d}+{r['new_tokens']:<4d} "
            f"{r['system']:11s} {r['tok_s']:9.1f} tok/s  steps {r['steps']:4d} (graphed {r['graphed_steps']:4d})"
            f"  decode wall/device/host ms {ms(r['decode_wall_ms_p50'])} {ms(r['decode_device_ms_p50'])}"
            f" {ms(r['decode_host_ms_p50'])}  mixed {ms(r['mixed_wall_ms_p50'])} {ms(r['mixed_device_ms_p50'])}"
            f" {ms(r['mixed_host_ms_p50'])}")
    if "vs_sync" in r:
        text += f"  x{r['vs_sync']:.2f} vs sync, same tokens {r['same_tokens_as_sync']}"
    if "acceptance_rate" in r:
        text += f"  accepted {r['acceptance_rate']:.0%} x{r['vs_none']:.2f}"
    return text


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", choices=["1b", "8b"], default=["1b", "8b"])
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--device", default="auto", help="auto (CUDA when torch sees a card), cpu or cuda")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--dry-run", action="store_true",
                   help="a tiny random model on the CPU, a few steps per workload: proves the plumbing, "
                        "its figures mean nothing")


def run(args: argparse.Namespace) -> dict:
    device = "cpu" if args.dry_run else pick_device(args.device)
    dtype = pick_dtype("auto", device)
    tok = byte_tokenizer()
    sizes = DRY if args.dry_run else WORKLOADS
    options = kernel_defaults(device, dtype)  # the server's choices for the device
    rows = []
    for name in ["tiny"] if args.dry_run else args.models:
        start = time.perf_counter()
        model = random_model(name, device, dtype)
        print(f"# {name}: random weights, {str(dtype).removeprefix('torch.')} on {device} "
              f"({time.perf_counter() - start:.1f} s); {describe(options, device, dtype)}")
        for workload in args.workloads:
            for i, (streams, prompt_len, new_tokens) in enumerate(sizes[workload]):
                rows += run_workload(name, model, tok, options, workload, streams, prompt_len, new_tokens,
                                     args.num_speculative_tokens, seed=i)
                if args.json:  # what is measured so far, in case a time limit stops the run
                    write_json(args.json, {"partial": True, "rows": rows})
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"dry_run": args.dry_run, "device": device, "dtype": str(dtype).removeprefix("torch."),
            "kernels": options, "rows": rows}


def report(result: dict) -> None:
    print(f"{len(result['rows'])} rows (printed above as measured); per-step wall/device/host ms and "
          "graphed flags in the JSON")


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.gpu_engine")

if __name__ == "__main__":
    main()
