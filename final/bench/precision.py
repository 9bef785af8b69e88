"""Lower precision on the CPU: speed and quality against float32, side by side in one run.

    python -m course.final.bench.precision [--results | --json out.json]

Variants (the engine as the server runs it on the CPU: kernel_defaults.py for each dtype):
  float32         the default
  bfloat16        the whole model in bf16 (`serve --dtype bfloat16`)
  int8 weights    int8 weight-only linears, float32 elsewhere (`serve --quantization int8`)

Speed: bench/profile.py's two workloads in process (single stream: 128 tokens; saturated: 40
ShareGPT requests at once), output tok/s. Quality against float32 (stage 06's precision.py):
teacher-forced top-1 agreement on float32's greedy answers to 8 held-out ShareGPT prompts
(64 tokens each), and perplexity of 8 held-out ShareGPT answers (up to 256 tokens each).
"""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import load_conversations, sample_requests

from .profile import profile
from ..engine import Engine
from ..launch.kernel_defaults import kernel_defaults

VARIANTS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8 weights": ("float32", "int8")}


def quality_data(tok, n: int = 8):
    """Held-out prompts (not the profile's: a different seed) and held-out answer texts."""
    prompts = [encode_prompt(tok, r.prompt, chat=True)
               for r in sample_requests(tok, n, seed=7, max_prompt_tokens=256, max_output_tokens=512)]
    answers = [c[1]["value"] for c in load_conversations(6000)[5000:] if len(c) > 1 and c[1]["from"] == "gpt"
               and len(c[1]["value"]) > 400][:n]
    texts = [tok.encode(a, add_special_tokens=False)[:256] for a in answers]
    return prompts, texts


def engine_model(loaded, dtype: str, quantization: str | None):
    """The model exactly as the engine runs it (the fused copy, split or quantized)."""
    engine = Engine(loaded.model, loaded.tokenizer, config_for(dtype, quantization), loaded.eos_token_ids,
                    prefetch_masks=False)
    return engine.runner.model


def config_for(dtype: str, quantization):
    """The server's CPU defaults for this dtype (kernel_defaults.py)."""
    from course.s06_kernels_graphs.engine import KernelEngineConfig

    return KernelEngineConfig(num_blocks=64, **kernel_defaults("cpu", getattr(torch, dtype), quantization=quantization))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--skip-speed", action="store_true")


def run(args: argparse.Namespace) -> dict:
    from course.s06_kernels_graphs.cpu.precision import perplexity, top1_agreement

    fp32 = load_model()
    prompts, texts = quality_data(fp32.tokenizer)
    ref_engine = Engine(fp32.model, fp32.tokenizer, config_for("float32", None), fp32.eos_token_ids,
                        prefetch_masks=False)
    reference = ref_engine.runner.model  # the model exactly as the engine runs it
    greedy = SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True)
    answers = [o.token_ids for o in ref_engine.generate(prompts, greedy)]
    rows = []
    for name in args.variants:
        dtype, quantization = VARIANTS[name]
        loaded = fp32 if dtype == "float32" else load_model(dtype=getattr(torch, dtype))
        model = reference if (dtype, quantization) == ("float32", None) else engine_model(loaded, dtype, quantization)
        row = {"name": name.replace(" ", "-"), "variant": name, "dtype": dtype, "quantization": quantization,
               "top1_agreement": sum(top1_agreement(reference, model, p, a) for p, a in zip(prompts, answers)) / len(prompts),
               "perplexity": perplexity(model, texts)}
        if not args.skip_speed:
            settings = SimpleNamespace(kv_blocks=512, max_num_seqs=32, max_num_batched_tokens=256, dtype=dtype,
                                       attention_backend=None, fused=None, linear_splits=None,
                                       quantization=quantization, one_call_layers=True)  # profile.py's defaults
            for workload in ("single", "saturated"):
                r = profile(loaded, settings, workload)
                row[f"{workload}_output_tok_s"] = r["output_tok_s"]
                row[f"{workload}_ms_per_step"] = r["ms_per_step"]
        rows.append(row)
    return {"rows": rows}


def report(result: dict) -> None:
    for row in result["rows"]:
        speed = (f"  single {row['single_output_tok_s']:.1f} tok/s  saturated {row['saturated_output_tok_s']:.1f} tok/s"
                 if "single_output_tok_s" in row else "")
        print(f"{row['variant']:<14} top-1 agreement {row['top1_agreement']:.3f}  perplexity {row['perplexity']:.3f}{speed}")


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.precision")

if __name__ == "__main__":
    main()
