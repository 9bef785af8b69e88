"""How big the CPU server's KV pool, batch and step are when the flags leave them unset.

  KV pool    $VLLM_CPU_KVCACHE_SPACE GiB when set (the variable vLLM for CPU reads); else
             KV_SHARE of the memory available at start-up, at most KV_CAP: on a 24 GiB machine
             ~2.3 GiB, 50k tokens of SmolLM2-135M in float32 (46 KB a token). A fixed 512-block
             pool (8k tokens) holds about 22 of the standard load's 364-token requests, so the
             rest wait for a second wave that decodes at a quarter of the batch.
  batch      max_num_seqs = SEQS (vLLM for CPU's server default): a batch of 32 leaves 8 of
             the standard load's 40 requests for a second wave that decodes 128 steps at a
             fifth of the width; the pool above holds 128 requests of ~400 tokens.
  step       max_num_batched_tokens = BUDGET: a chunk's products are at MKL's rate by 256
             rows, so 512 to 2,048 tokens a step gain nothing measurable in throughput and
             stall the decodes beside them 2-6x longer (the longest step grows with the chunk).

The rule, read off `python -m course.final.bench.sizing` (final/results/sizing.json: output
tok/s of vLLM's ShareGPT load per max_num_seqs and budget, with the longest step): the smallest
budget within 5% of the best throughput. Every value prints at start-up; each flag overrides
its own.
"""
from __future__ import annotations

import os

KV_SHARE, KV_CAP = 0.10, 4 * 2**30
SEQS, BUDGET = 128, 256
GPU_SEQS, GPU_BUDGET = 32, 256  # CUDA keeps the sizes its graphs are captured for (kernel_options.py)


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes the kernel says a new allocation can take (MemAvailable), or None off Linux."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_kv_bytes(environ=os.environ, available: int | None = None) -> tuple[int, str]:
    """(bytes for the CPU's KV pool, where that figure comes from)."""
    space = environ.get("VLLM_CPU_KVCACHE_SPACE")
    if space:
        try:
            gib = float(space)
        except ValueError:
            raise ValueError(f"VLLM_CPU_KVCACHE_SPACE={space!r} is not a number of GiB") from None
        if gib > 0:
            return int(gib * 2**30), f"VLLM_CPU_KVCACHE_SPACE={space} GiB"
    available = available_memory() if available is None else available
    if available is None:
        return KV_CAP // 4, "1 GiB: this system does not say how much memory is free"
    share = min(int(KV_SHARE * available), KV_CAP)
    return share, f"{KV_SHARE:.0%} of {available / 2**30:.1f} GiB available" + (", capped" if share == KV_CAP else "")


def step_sizes(args, device: str) -> str:
    """Fill args.max_num_seqs / max_num_batched_tokens where unset; a line saying what they are."""
    cuda = device.startswith("cuda")
    chosen = []
    if args.max_num_seqs is None:
        args.max_num_seqs = GPU_SEQS if cuda else SEQS
        chosen.append("max_num_seqs")
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = GPU_BUDGET if cuda else BUDGET
        chosen.append("max_num_batched_tokens")
    source = f" ({' and '.join(chosen)}: {'the graphs' if cuda else 'this CPU'}'s defaults)" if chosen else ""
    return f"max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}{source}"
