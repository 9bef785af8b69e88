"""`python -m course.s06_kernels_graphs`: stage 04's command line, plus the choice of attention
backend, its kernels, fused kernels and graphs. Without CUDA the Triton backend runs through the
interpreter (same code path, very slow: tiny models only) and `--cuda-graphs` uses the eager
stand-in (graph_runner.py), which checks that every step it replays could be captured.

This is the one place that plugs the stage's rooms into the lesson's seams (`register_rooms`)."""
from __future__ import annotations

import sys

import torch

from course.s04_continuous_batching.cli import run_cli

from . import cpu, gpu, int8_kv, mixed_graphs, overlap
from .engine import BACKENDS, KernelEngineConfig, LLMEngine
from .triton_backend import KERNEL_SETS


def register_rooms() -> None:
    """Each room's `register()` (cpu/, gpu/, int8_kv/, mixed_graphs/, overlap/) says what it plugs in."""
    for room in (cpu, gpu, int8_kv, mixed_graphs, overlap):
        room.register()


def add_args(group) -> None:
    group.add_argument("--backend", choices=sorted(BACKENDS), default="torch", help="attention backend")
    group.add_argument("--kernels", choices=sorted(KERNEL_SETS), default="lesson",
                       help="the Triton backend's kernels: the lesson's, or gpu/'s tensor-core ones")
    group.add_argument("--cuda-graphs", action="store_true", help="replay steps from captured graphs")
    group.add_argument("--fused", action="store_true", help="merged QKV/gate-up, fused add+RMSNorm and RoPE")
    group.add_argument("--graph-max-seq-len", type=int, default=2048)
    group.add_argument("--graph-max-num-tokens", type=int, default=512,
                       help="largest token bucket of captured mixed steps (0: decode steps only)")
    group.add_argument("--num-splits", type=int, help="Triton decode split-K partitions (default: per step)")


def make_engine(loaded, args, config: dict) -> LLMEngine:
    if (args.backend == "triton" or args.cuda_graphs) and not torch.cuda.is_available():
        print("note: no CUDA device: " + ", ".join(
            (["the Triton kernels run through the interpreter (slow)"] if args.backend == "triton" else []) +
            (["graphs use the eager stand-in under the sync guard"] if args.cuda_graphs else [])), file=sys.stderr)
    kernel = KernelEngineConfig(**config, attention_backend=args.backend, cuda_graphs=args.cuda_graphs,
                                fused=args.fused, graph_max_seq_len=args.graph_max_seq_len, num_splits=args.num_splits,
                                graph_max_num_tokens=args.graph_max_num_tokens, triton_kernels=args.kernels)
    return LLMEngine(loaded.model, loaded.tokenizer, kernel, loaded.eos_token_ids)


def main(argv: list[str] | None = None) -> int:
    register_rooms()
    return run_cli(argv, "Stage 06: Triton kernels and CUDA graphs behind stage 04's engine.", add_args, make_engine)
