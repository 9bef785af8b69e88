"""A quantized KV cache on the CPU: quality, capacity and speed against float32 K/V, side by side
in one run.

    python -m course.final.bench.kv_cache [--results | --json out.json] [--skip-speed]

Variants: what `serve --kv-cache-dtype` stores (stage 03's quantized_kv.py): float32 (the
default), bfloat16, int8 and fp8 (e4m3) codes of Walsh-Hadamard-rotated rows with a scale byte
per token and KV head, and int8 K/V beside int8 weights (`--quantization int8`).

Quality against float32 K/V (final/bench/precision.py's data): teacher-forced top-1 agreement on
float32's greedy answers to 8 held-out ShareGPT prompts (64 tokens each) and perplexity of 8
held-out ShareGPT answers, every K and V row stored and read back as the pool would; greedy
answers through the engine (the cpu backend's C layers) compared with float32's: how many are
identical, and where the others first differ.

Where int8's error comes from (quality only): int8 values with float32 keys, int8 keys with
float32 values, and int8 K/V stored without the rotation (what the rotation buys).

Capacity: the tokens 1 GiB of `--kv-memory` holds (launch/kv_pool.py's accounting).

Speed, the server's CPU defaults in process (bench/profile.py); the AVX2 hosts' path on any host:
`COURSE_CPU_ARCH=haswell ONEDNN_MAX_CPU_ISA=AVX2 python -m course.final.bench.kv_cache ...`:
  decode64   64 requests of ~320 tokens all decoding: ms per step, and the share of it the
             attention kernel takes (the kernel alone over the same rows and pools, every layer)
  saturated  profile.py's 40 ShareGPT requests at once, 128 tokens each: output tok/s
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from course.s01_decode_loop.attention import FullCausalAttention
from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s03_paged.quantized_kv import dequantize, load_rows, pool_bytes_per_token, quantize, storage_dtype, store_rows

from ..engine import Engine
from .precision import config_for, quality_data
from .profile import profile

VARIANTS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8": ("int8", None),
            "fp8": ("fp8", None), "int8 + int8 weights": ("int8", "int8")}
GIB = 2 ** 30


# where int8's error comes from (quality only): (keys, values) each stored as (dtype, rotated)
ABLATIONS = {"int8 values only": ((torch.float32, True), (torch.int8, True)),
             "int8 keys only": ((torch.int8, True), (torch.float32, True)),
             "int8, rows not rotated": ((torch.int8, False), (torch.int8, False))}


def stored(x: torch.Tensor, dtype: torch.dtype, rotated: bool = True) -> torch.Tensor:
    """x as a pool of `dtype` gives it back (rotated = False: quantized as the rows are, the
    ablation's way)."""
    if rotated:
        return load_rows(*store_rows(x, dtype), x.dtype)
    return dequantize(*quantize(x, dtype), x.dtype)


class StoredKVAttention(FullCausalAttention):
    """Full causal attention over K/V stored and read back as a pool stores them."""

    def __init__(self, keys: tuple[torch.dtype, bool], values: tuple[torch.dtype, bool]):
        self.keys, self.values = keys, values

    def forward(self, layer, q, k, v, meta):
        return super().forward(layer, q, stored(k, *self.keys), stored(v, *self.values), meta)


def quality(reference, model, attention: StoredKVAttention, prompts, answers, texts) -> dict:
    """Top-1 agreement with `reference` (float32 K/V) and perplexity, K/V stored as `attention` stores them."""
    from course.s06_kernels_graphs.cpu.precision import perplexity, top1_agreement

    agree = [top1_agreement(reference, model, p, a, attention) for p, a in zip(prompts, answers)]
    return {"top1_agreement": statistics.mean(agree), "perplexity": perplexity(model, texts, attention)}


def engine_for(loaded, kv: str, quantization, num_blocks: int = 2048, **kw) -> Engine:
    config = config_for("float32", quantization)
    config.num_blocks, config.kv_cache_dtype, config.record_steps = num_blocks, kv, False
    for name, value in kw.items():
        setattr(config, name, value)
    return Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids, prefetch_masks=False)


def greedy_answers(loaded, kv, quantization, prompts) -> list[list[int]]:
    greedy = SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine_for(loaded, kv, quantization).generate(prompts, greedy)]


def decode64(loaded, kv: str, quantization, rows: int = 64, prompt_len: int = 320, steps: int = 12) -> dict:
    """ms per step of `rows` requests all decoding, and the attention kernel's share of it."""
    from course.s06_kernels_graphs.cpu.attention import paged_attention_rows

    engine = engine_for(loaded, kv, quantization, max_num_seqs=rows, max_num_batched_tokens=512)
    g = torch.Generator().manual_seed(0)
    for _ in range(rows):
        engine.add_request(torch.randint(100, 40000, (prompt_len,), generator=g).tolist(),
                           SamplingParams(max_new_tokens=steps * 3 + 40, temperature=0, ignore_eos=True))
    while any(r.num_computed_tokens < len(r.seq.prompt_ids) for r in engine.requests.values()):
        engine.step()
    for _ in range(3):  # every request decoding now
        engine.step()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_s = (time.perf_counter() - t) / steps
    cache, config = engine.cache, loaded.model.config
    length = prompt_len + steps  # tokens every request holds by now (the kernel reads that many)
    tables = torch.tensor([engine.blocks.tables[seq][: -(-length // cache.block_size)]
                           for seq in list(engine.blocks.tables)[:rows]], dtype=torch.long)
    lens = torch.full((rows,), length, dtype=torch.long)
    q = torch.randn(rows, config.num_attention_heads, config.head_dim, generator=g)
    every = torch.arange(rows)
    t = time.perf_counter()
    for _ in range(steps):
        for layer in range(config.num_hidden_layers):
            k_pool, v_pool = cache.pools(layer)
            paged_attention_rows(q, k_pool, v_pool, tables, every, every, lens)
    attention_s = (time.perf_counter() - t) / steps
    return {"decode64_ms_per_step": 1e3 * step_s, "decode64_attention_ms": 1e3 * attention_s,
            "decode64_attention_share": attention_s / step_s}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=True,
                   help="also int8 keys or values alone, and int8 rows not rotated (quality only)")


def run(args: argparse.Namespace) -> dict:
    from .precision import engine_model

    fp32 = load_model()
    prompts, texts = quality_data(fp32.tokenizer)
    reference = engine_model(fp32, "float32", None)
    want = greedy_answers(fp32, "auto", None, prompts)
    rows = []
    for name in args.variants:
        kv, quantization = VARIANTS[name]
        dtype = storage_dtype(kv, torch.float32)
        model = reference if quantization is None else engine_model(fp32, "float32", quantization)
        got = want if name == "float32" else greedy_answers(fp32, kv, quantization, prompts)
        firsts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(got, want)]
        row = {"name": name.replace(" + ", "-").replace(" ", "-"), "variant": name, "kv_cache_dtype": kv,
               "quantization": quantization,
               **quality(reference, model, StoredKVAttention((dtype, True), (dtype, True)), prompts, want, texts),
               "greedy_identical": sum(f is None for f in firsts), "greedy_prompts": len(prompts),
               "first_divergence": [f for f in firsts if f is not None],
               "bytes_per_token": pool_bytes_per_token(fp32.model.config, dtype),
               "tokens_per_gib": GIB // pool_bytes_per_token(fp32.model.config, dtype)}
        if not args.skip_speed:
            row.update(decode64(fp32, kv, quantization))
            settings = SimpleNamespace(kv_blocks=2048, max_num_seqs=40, max_num_batched_tokens=256, dtype="float32",
                                       attention_backend=None, fused=None, linear_splits=None,
                                       quantization=quantization, one_call_layers=True, kv_cache_dtype=kv)
            r = profile(fp32, settings, "saturated")
            row["saturated_output_tok_s"], row["saturated_ms_per_step"] = r["output_tok_s"], r["ms_per_step"]
        rows.append(row)
    for name, (keys, values) in ABLATIONS.items() if args.ablations else ():
        rows.append({"name": name.replace(", ", "-").replace(" ", "-"), "variant": name, "ablation": True,
                     **quality(reference, reference, StoredKVAttention(keys, values), prompts, want, texts)})
    base = rows[0] if rows[0]["variant"] == "float32" else None
    for row in rows:
        if base:
            row["perplexity_vs_float32"] = row["perplexity"] / base["perplexity"]
        if base and not row.get("ablation"):
            row["tokens_vs_float32"] = row["tokens_per_gib"] / base["tokens_per_gib"]
            if "saturated_output_tok_s" in row and "saturated_output_tok_s" in base:
                row["saturated_vs_float32"] = row["saturated_output_tok_s"] / base["saturated_output_tok_s"]
                row["attention_share_vs_float32"] = row["decode64_attention_share"] / base["decode64_attention_share"]
    return {"model": "SmolLM2-135M-Instruct", "rows": rows, **isa_path()}


def isa_path() -> dict:
    """What the C kernels were built for (stage 06's cpu/native.py: $COURSE_CPU_ARCH, e.g. haswell
    for the AVX2 hosts' path) and oneDNN's cap, beside this CPU's own vector extensions."""
    import os

    flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split() if os.path.exists(
        "/proc/cpuinfo") else []
    return {"c_kernels_march": os.environ.get("COURSE_CPU_ARCH") or "native",
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "cpu_vector_extensions": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "amx_int8") if f in flags]}


def report(result: dict) -> None:
    print(f"C kernels for -march={result['c_kernels_march']} (this CPU: {' '.join(result['cpu_vector_extensions'])})")
    for row in result["rows"]:
        if row.get("ablation"):
            print(f"{row['variant']:<28} top-1 {row['top1_agreement']:.3f}  ppl {row['perplexity']:.3f}")
            continue
        line = (f"{row['variant']:<20} top-1 {row['top1_agreement']:.3f}  ppl {row['perplexity']:.3f}"
                f" ({row.get('perplexity_vs_float32', 1):.4f}x)  greedy identical {row['greedy_identical']}/"
                f"{row['greedy_prompts']}  {row['tokens_per_gib']:,} tokens/GiB ({row.get('tokens_vs_float32', 1):.2f}x)")
        if "decode64_ms_per_step" in row:
            line += (f"\n{'':<20} decode64 {row['decode64_ms_per_step']:.1f} ms/step, attention "
                     f"{row['decode64_attention_ms']:.1f} ms ({row['decode64_attention_share']:.0%}); saturated "
                     f"{row['saturated_output_tok_s']:.1f} tok/s ({row.get('saturated_vs_float32', 1):.2f}x)")
        print(line)


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.kv_cache")

if __name__ == "__main__":
    main()
