"""Start tensor parallelism for `serve`: refuse, choose the kernel options, spawn the ranks.

    python -m course.final serve --tensor-parallel-size 2                        # spawns rank 1
    torchrun --nproc-per-node 2 -m course.final serve --tensor-parallel-size 2   # torchrun starts both

TP runs the model's plain torch forward (stage 06's `torch` attention on the CPU, `triton` on
CUDA; unfused, no graphs, no overlap): the fused model and the CPU's one-call C layers merge the
linears TP splits, and captured graphs or overlapped steps would run collectives no broadcast
announced. Options left to their defaults are set so, with a printed line; options asked for
explicitly are refused. A rank that fails makes the server drain and exit (SIGTERM to itself):
requests in flight get the engine's error, and the other ranks are stopped.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.default_model import DEFAULT_MODEL_NAME
from course.s07_disaggregated.cli import resolve_model_dir
from course.s07_disaggregated.tensor_parallel.comm import torchrun_rank
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec, run_rank
from course.s07_disaggregated.tensor_parallel.sharding import check_divisible

from ..launch.kernel_defaults import pick_device, pick_dtype
from ..launch.sizing import cpu_kv_bytes


def tp_options(args: argparse.Namespace) -> str:
    """Refuse what TP cannot run; set the rest of the kernel options to its plain forward."""
    cuda = pick_device(args.device).startswith("cuda")
    asked = {"--disaggregated": args.disaggregated, "--fused": args.fused, "--cuda-graphs": args.cuda_graphs,
             "--overlap": args.overlap, "--quantization": args.quantization,
             "--attention-backend cpu": args.attention_backend == "cpu",
             "--linear-splits": args.linear_splits not in (None, 1),
             "--speculative-method eagle": args.speculative_method == "eagle"}  # EAGLE reuses the cut embedding
    refused = [flag for flag, given in asked.items() if given]
    if refused:
        raise ValueError(f"{refused[0]} does not combine with --tensor-parallel-size: tensor parallelism runs the "
                         "model's plain torch forward, every linear split over the ranks")
    args.attention_backend = args.attention_backend or ("triton" if cuda else "torch")
    args.fused, args.cuda_graphs, args.overlap, args.linear_splits = False, False, False, 1
    if not cuda and args.kv_memory is None and args.kv_blocks is None:  # the ranks share this machine's memory:
        args.kv_memory = str(cpu_kv_bytes()[0] // args.tensor_parallel_size)  # its KV budget, split N ways
    return (f"tensor parallel over {args.tensor_parallel_size} processes ({'NCCL' if cuda else 'gloo'}): "
            f"plain torch forward, attention {args.attention_backend}, unfused, no graphs, no overlap "
            "(the fused and one-call C layers cannot be split)")


def start_tensor_parallel(args: argparse.Namespace) -> TensorParallel | None:
    """None for one process. Under torchrun, ranks > 0 follow rank 0 here and the process exits."""
    if args.tensor_parallel_size == 1:
        return None
    line = tp_options(args)
    model_dir = resolve_model_dir(args.model)  # the default model converted once, here, not by every rank
    check_divisible(ModelConfig.from_json(model_dir / "config.json"), args.tensor_parallel_size)
    device = pick_device(args.device)
    args.served_model_name = args.served_model_name or args.model or DEFAULT_MODEL_NAME  # the name a client knows
    args.model = str(model_dir)
    threads = None if device.startswith("cuda") else max(1, torch.get_num_threads() // args.tensor_parallel_size)
    if threads:  # the ranks share this machine's cores
        torch.set_num_threads(threads)
        line += f"; {threads} torch thread(s) a rank"
    spec = TPSpec(args.tensor_parallel_size, args.model, str(pick_dtype(args.dtype, device)).removeprefix("torch."),
                  device, timeout_s=args.tp_timeout, threads=threads)
    rank = torchrun_rank()
    if rank:  # torchrun started this process as a follower: it never serves
        run_rank(spec, rank)
        sys.exit(0)
    print(line, file=sys.stderr, flush=True)
    return TensorParallel.start(spec, on_failure=lambda reason: os.kill(os.getpid(), signal.SIGTERM))
