"""Stage 06 benchmark: the decode step, side by side, and end-to-end tok/s.

    python -m course.s06_kernels_graphs.bench.benchmark [--model 1b-random|135m-random] [--batches 1 4 16]
                                                        [--context 256] [--kernels lesson|gpu] [--quick]
                                                        [--json out.json | --results]

1. The decode step at each batch size, every variant on the same pool, in one run:
     stage 04       stage 03's PagedAttention, metadata built from fresh tensors each step
     runner         this stage's ModelRunner (persistent buffers), PyTorch backend
     runner+fused   ... plus merged QKV/gate-up weights and fused norm/RoPE
     +split         ... with every linear as one bmm over row blocks (split_linear.py; CPU)
     graphs         ... replayed from a captured CUDA graph (CPU: the eager stand-in, which
                    only checks capturability and adds its guard's overhead)
     triton ...     the same with the Triton kernels (CUDA only: the interpreter is a checker), the
                    set `--kernels` names (the lesson's by default; `gpu`: the gpu room's)
   with the achieved bandwidth (bytes the step must move / time) against the measured copy
   bandwidth: the roofline point of each row.
2. End to end: stage 04's engine vs this stage's best setting vs transformers `generate`.

Kernel-level bandwidth (GPU) and the interpreter's correctness run: bench_kernels.py.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli, timed
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine

from .. import cpu, gpu, mixed_graphs
from ..engine import make_backend
from ..cpu.split_linear import split_linears
from ..engine import KernelEngineConfig, LLMEngine
from ..fused_model import FusedCausalLM
from ..graph_runner import GraphRunner
from ..model_runner import ModelRunner
from ..triton_backend import TritonPagedBackend
from .roofline import copy_bandwidth, decode_cost, device_timed

BLOCK = 16
# Llama-3.2-1B's shape with random weights: a 1B-class model, no download needed
ONE_B = ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                    rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=True)
# SmolLM2-135M's shape with random weights: the default model's step where its weights cannot travel
SMOLLM2_SHAPE = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                            rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True)
RANDOM = {"1b-random": ONE_B, "135m-random": SMOLLM2_SHAPE}


def load(name: str, device, dtype):
    if name == "tiny":
        return tiny_model("gqa_tied").to(device), None
    if name in RANDOM:
        torch.manual_seed(0)
        return init_random_weights(CausalLM(RANDOM[name]), 0).to(device, dtype).eval(), None
    from course.s01_decode_loop.weights import load_model
    loaded = load_model(dtype=dtype, device=str(device))
    return loaded.model, loaded.tokenizer


def decode_variants(model, cache, batch: int, context: int, on_gpu: bool, kernels: str = "lesson"):
    """name -> a function running one decode step of `batch` sequences at `context` tokens."""
    blocks_per_seq = -(-context // BLOCK)
    seqs = [(context - 1, 1, list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq))) for b in range(batch)]
    token_ids, rows = [1] * batch, list(range(batch))
    dummy = cache.k.shape[1] - 1
    ref = PagedAttention(cache)

    def stage04():
        meta = PagedAttentionMetadata.build(seqs, BLOCK, model.device)
        ids = torch.tensor(token_ids, device=model.device)
        return model.compute_logits(model(ids, ref, meta))

    def runner(backend: str, fused: bool, graphs: bool, splits: int = 1):
        m = FusedCausalLM(model) if fused else model
        if splits > 1:
            split_linears(m, splits)
        attn = TritonPagedBackend(cache, kernels=kernels) if backend == "triton" else make_backend(backend, cache)
        if fused:
            m.follow(attn)
        g = GraphRunner(m, attn, max_batch=batch, max_seq_len=context, dummy_block=dummy) if graphs else None
        r = ModelRunner(m, attn, max_num_tokens=batch, max_num_seqs=batch, max_blocks_per_seq=blocks_per_seq,
                        dummy_block=dummy, graphs=g)
        return lambda: r.run(token_ids, seqs, rows)

    variants = {"stage 04": stage04, "runner": runner("torch", False, False),
                "runner+fused": runner("torch", True, False), "graphs+fused": runner("torch", True, True)}
    if not on_gpu and torch.get_num_threads() > 1:
        variants["runner+fused+split"] = runner("torch", True, False, torch.get_num_threads())
    if on_gpu:
        variants |= {"triton": runner("triton", False, False), "triton+fused": runner("triton", True, False),
                     "triton+fused+graphs": runner("triton", True, True)}
    return variants


@torch.no_grad()
def decode_table(model, batches, context, device, kernels: str = "lesson") -> list[dict]:
    bw = copy_bandwidth(device)
    rows = []
    for batch in batches:
        blocks = batch * -(-context // BLOCK) + 1
        cache = PagedKVCache(model.config, blocks, BLOCK, model.dtype, model.device)
        cache.k.normal_()
        cache.v.normal_()
        cost = decode_cost(model, batch, context)
        variants = decode_variants(model, cache, batch, context, device.type == "cuda", kernels)
        base = None
        for name, step in variants.items():
            seconds = device_timed(step, device, warmup=3, reps=10)
            base = base or seconds
            rows.append({"name": f"{name}/batch={batch}", "batch": batch, "context": context, "variant": name,
                         "step_ms": seconds * 1e3,
                         "speedup_vs_stage04": base / seconds, "achieved_GBps": cost.bytes / seconds / 1e9,
                         "pct_of_copy_bw": 100 * cost.bytes / seconds / bw, "tok_s": batch / seconds})
            r = rows[-1]
            print(f"B={batch:3d} L={context:5d} {name:20s} {r['step_ms']:9.2f} ms  x{r['speedup_vs_stage04']:5.2f}"
                  f"  {r['achieved_GBps']:7.1f} GB/s ({r['pct_of_copy_bw']:4.1f}% of copy)  {r['tok_s']:8.1f} tok/s")
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s; intensity at B=1: {decode_cost(model, 1, context).intensity:.2f} FLOP/B")
    return rows


def end_to_end(model, tok, device, prompts: int, new_tokens: int, best: KernelEngineConfig) -> list[dict]:
    """All prompts submitted at once, greedy, fixed output length: tok/s of each system."""
    g = torch.Generator().manual_seed(0)
    top = min(5000, model.config.vocab_size)
    work = [torch.randint(3, top, (int(n),), generator=g).tolist() for n in torch.randint(16, 96, (prompts,), generator=g)]
    greedy = lambda n: SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)  # noqa: E731
    eng = dict(num_blocks=prompts * 16 + 8, block_size=BLOCK, max_num_seqs=prompts, max_num_batched_tokens=1024)

    def stage06(batch, n):
        return LLMEngine(model, tok, best).generate(batch, greedy(n))

    systems = {"stage 04 engine": lambda batch, n: BatchingEngine(model, tok, EngineConfig(**eng)).generate(batch, greedy(n)),
               f"stage 06 engine ({describe(best)})": stage06,
               "transformers generate": lambda batch, n: hf_generate(model, batch, n)}
    rows = []
    for name, run in systems.items():
        # Warm-up outside the clock: stage 06 runs the whole workload once (Triton compiles its
        # kernels; each run builds a fresh engine, so graphs are captured inside the timed run
        # too), the others a short prompt (transformers builds its model twin, every system
        # loads its GPU libraries).
        run(work, new_tokens) if run is stage06 else run([work[0][:8]], 2)
        wall = timed(run, work, new_tokens, device=device)
        rows.append({"name": name.split(" (")[0], "system": name, "tok_s": prompts * new_tokens / wall, "wall_s": wall})
        print(f"{name:55s} {rows[-1]['tok_s']:8.1f} tok/s")
    return rows


def describe(c: KernelEngineConfig) -> str:
    kernels = [c.triton_kernels] if c.attention_backend == "triton" else []
    return "+".join([c.attention_backend] + kernels + ["fused"] * c.fused
                    + [f"split{c.linear_splits}"] * (c.linear_splits > 1) + ["graphs"] * c.cuda_graphs)


def hf_generate(model, work, new_tokens):
    """transformers' LlamaForCausalLM with our weights, one static left-padded batch."""
    from transformers import LlamaConfig, LlamaForCausalLM
    hf = getattr(model, "_hf_twin", None)
    if hf is None:
        hf = LlamaForCausalLM(LlamaConfig(**model.config.to_hf())).to(model.device, model.dtype).eval()
        hf.load_state_dict(model.state_dict(), strict=False)
        model._hf_twin = hf
    width = max(map(len, work))
    ids = torch.tensor([[0] * (width - len(w)) + w for w in work], device=model.device)
    mask = (ids != 0).long()
    with torch.no_grad():
        hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                    pad_token_id=0)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default (SmolLM2-135M), 1b-random, 135m-random (its shape, random weights) or tiny")
    p.add_argument("--batches", type=int, nargs="+")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--kernels", choices=["lesson", "gpu"], default="lesson", help="the Triton rows' kernel set")
    p.add_argument("--quick", action="store_true", help="tiny model, small sizes (a smoke run)")


def run(args) -> dict:
    gpu.register()  # the gpu room's kernel set, for --kernels gpu
    cpu.register()  # the split linears of the CPU's best setting
    mixed_graphs.register()  # the best GPU setting's graphs hold steps with prefill chunks too
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = "tiny" if args.quick else args.model
    model, tok = load(name, device, dtype)
    if tok is None:
        from course.s01_decode_loop.testing import byte_tokenizer
        tok = byte_tokenizer()
    batches = args.batches or ([1, 4] if args.quick else [1, 2, 4, 8, 16, 32, 64] if device.type == "cuda" else [1, 4, 16])
    print(f"# {name}, {dtype}")
    decode = decode_table(model, batches, args.context, device, args.kernels)
    splits = 1 if device.type == "cuda" else torch.get_num_threads()
    best = KernelEngineConfig(num_blocks=args.prompts * 16 + 8, block_size=BLOCK, max_num_seqs=args.prompts,
                              max_num_batched_tokens=1024, fused=True, cuda_graphs=device.type == "cuda",
                              linear_splits=splits, triton_kernels=args.kernels,
                              attention_backend="triton" if device.type == "cuda" else "torch")
    e2e = end_to_end(model, tok, device, args.prompts, args.new_tokens, best)
    if device.type != "cuda":
        print("# no GPU here: Triton kernels, their bandwidth and real CUDA graphs need one "
              "(the interpreter's correctness run: python -m course.s06_kernels_graphs.bench.bench_kernels)")
    return {"model": name, "dtype": str(dtype), "kernels": args.kernels, "decode": decode, "e2e": e2e}


main = bench_cli(__doc__, add_args, run, lambda result: None, module="course.s06_kernels_graphs.bench.benchmark")


if __name__ == "__main__":
    main()
