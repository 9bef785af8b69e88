"""The `serve` command's stage 06 options: its flags, what they leave to the device's defaults
(kernel_defaults.py), the graphs' bounds, and the capture of every graph before the port opens."""
from __future__ import annotations

import argparse
import sys
import time

from .kernel_defaults import kernel_defaults, pick_device, pick_dtype


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    k = parser.add_argument_group("kernels (stage 06)")
    k.add_argument("--attention-backend", choices=["torch", "cpu", "triton"],
                   help="default: triton on CUDA; on the CPU stage 06's C kernel (cpu) for float32 when a C "
                        "compiler is there, else torch")
    k.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction,
                   help="replay decode steps from captured graphs (default: on with CUDA)")
    k.add_argument("--graph-max-seq-len", type=int,
                   help="steps with a longer sequence run eagerly (default: the model's context, or the pool's "
                        "size if smaller)")
    k.add_argument("--graph-max-num-tokens", type=int, default=512,
                   help="largest token count of a captured mixed step (prefill chunks, verifications); 0: "
                        "decode steps only")
    k.add_argument("--overlap", action=argparse.BooleanOptionalAction,
                   help="launch a steady decode step before reading the last one's tokens (default: on with CUDA)")
    k.add_argument("--fused", action=argparse.BooleanOptionalAction,
                   help="merged QKV/gate-up weights, fused add+RMSNorm and RoPE (default: on, except on a "
                        "1-thread CPU with unsplit linears)")
    k.add_argument("--quantization", choices=["int8"],
                   help="int8 weight-only linears (stage 06's int8_linear.py): faster decode, outputs close to "
                        "but not equal to float32's (default: none)")
    k.add_argument("--linear-splits", type=int,
                   help="each linear as a bmm over this many row blocks (default: torch's thread count on "
                        "the CPU, 1 on CUDA; 1 = torch's linear)")


def graph_options(args: argparse.Namespace, blocks: int) -> dict:
    """The graphs' bounds: sequences up to --graph-max-seq-len (default: as long as the pool holds;
    the engine caps it at the model's context), mixed steps up to --graph-max-num-tokens."""
    max_seq_len = args.graph_max_seq_len or blocks * args.block_size
    return {"graph_max_seq_len": max_seq_len, "graph_max_num_tokens": args.graph_max_num_tokens}


def warm_up(llm, log=lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Capture every graph bucket before the first request (Triton compiles inside the captures)."""
    graphs = llm.runner.graphs
    if graphs is None:
        return
    log(f"capturing graphs: {len(graphs.buckets)} decode + {len(graphs.token_buckets)} mixed buckets ...")
    start = time.perf_counter()
    llm.warm_up()
    log(f"capturing graphs: done in {time.perf_counter() - start:.1f} s")


def kernel_options(args: argparse.Namespace) -> dict:
    """Stage 06's choices: what the flags set, the device's defaults for the rest (launch/kernel_defaults.py)."""
    device = pick_device(args.device)
    return kernel_defaults(device, pick_dtype(getattr(args, "dtype", "auto"), device),
                           attention_backend=args.attention_backend, cuda_graphs=args.cuda_graphs, fused=args.fused,
                           linear_splits=args.linear_splits, quantization=getattr(args, "quantization", None),
                           overlap=getattr(args, "overlap", None))
