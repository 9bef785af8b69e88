"""`python -m course.s07_disaggregated --tensor-parallel-size N --prompt ...`: stage 01's contract,
the prompts run together through one engine whose model is cut over N processes.

Rank 0 is this process (stage 06's engine on the plain torch forward, its scheduler, sampling
and printing); ranks 1..N-1 are spawned and follow it (or, under `torchrun --nproc-per-node N -m
course.s07_disaggregated ...`, torchrun starts them all and ranks > 0 follow). Disaggregated topologies and `serve` are
refused here: `python -m course.final serve --tensor-parallel-size N` serves the OpenAI API.
"""
from __future__ import annotations

import json
import sys

from course.s01_decode_loop.cli import read_prompts, sampling_params
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.weights import ModelLoadError
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

from .comm import torchrun_rank
from .launch import TensorParallel, TPSpec, exit_now, run_rank
from .sharding import check_divisible


def refusal(args) -> str | None:
    """Why these flags cannot run with tensor parallelism, or None."""
    if args.command == "serve":
        return "serve with --tensor-parallel-size: run `python -m course.final serve --tensor-parallel-size N`"
    if args.replicas or args.prefill != 1 or args.decode != 1:
        return ("--tensor-parallel-size does not combine with --prefill/--decode/--replicas here: one "
                "tensor-parallel engine runs whole requests")
    return None


def run_tensor_parallel(args, resolve_model_dir) -> int:
    n = args.tensor_parallel_size
    try:
        if (why := refusal(args)) is not None:
            raise ValueError(why)
        prompts, params = read_prompts(args), sampling_params(args)
        model_dir = resolve_model_dir(args.model)
        check_divisible(ModelConfig.from_json(model_dir / "config.json"), n)  # before any process starts
    except (ValueError, ModelLoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    spec = TPSpec(n, str(model_dir), args.dtype, args.device)
    if rank := torchrun_rank():  # torchrun started this process as a follower: no prompts, no printing
        run_rank(spec, rank)
        return 0
    with TensorParallel.start(spec) as tp:
        loaded, model = tp.load_shard()
        config = KernelEngineConfig(num_blocks=args.kv_blocks, block_size=args.block_size,
                                    max_num_batched_tokens=args.max_num_batched_tokens)
        engine = LLMEngine(model, loaded.tokenizer, config, loaded.eos_token_ids)
        tp.attach(engine)
        ids = [encode_prompt(loaded.tokenizer, p, args.chat, args.system) for p in prompts]
        outputs = engine.generate(ids, params)
    for prompt, out in zip(prompts, outputs):
        print(json.dumps(out.to_json(prompt)) if args.json else f"--- {prompt!r}\n{out.text}\n", flush=True)
    if torchrun_rank() == 0:  # torchrun's rank 0 has left the group: end as the followers do
        exit_now(0)
    return 0
