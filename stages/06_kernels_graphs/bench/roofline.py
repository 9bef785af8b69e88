"""The decode roofline: how many bytes a step must move and how many FLOPs it must do.

A decode step of batch B at context L reads every weight once (shared by the B rows) and
each sequence's K/V (B * L tokens), and does ~2 FLOPs per weight per row plus attention.
Its arithmetic intensity (FLOPs / byte) is ~B for the weights, and ~1 for attention whatever
B is, so decode stays memory-bound until B reaches the machine's FLOPs/bytes ratio (an H100:
~990 TFLOP/s bf16 / 3.35 TB/s ≈ 295; our 2-core CPU: ~200 GFLOP/s / 32 GB/s ≈ 6). The best
a step can do is max(bytes / bandwidth, FLOPs / peak); `achieved` says how close a measured
time came.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s01_decode_loop.bench.measure import median_of
from course.s03_paged.quantized_kv import pool_bytes_per_token


@dataclass
class DecodeCost:
    weight_bytes: int
    kv_bytes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def decode_cost(model, batch: int, context: int, kv_dtype: torch.dtype | None = None) -> DecodeCost:
    """Bytes and FLOPs of one decode step (batch sequences, each with `context` tokens cached).
    `kv_dtype`: the pool's (default: the model's); an int8 or fp8 pool's bytes count its scales."""
    c = model.config
    elem = model.dtype.itemsize
    params = sum(p.numel() for p in model.parameters())
    embed = c.vocab_size * c.hidden_size  # an embedding lookup reads B rows, not the table
    matmul_params = params - embed + (embed if c.tie_word_embeddings else 0)  # the lm_head is a matmul
    kv_per_token = pool_bytes_per_token(c, kv_dtype or model.dtype)
    attn_flops = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context  # QK and PV
    return DecodeCost(weight_bytes=matmul_params * elem, kv_bytes=batch * context * kv_per_token,
                      flops=batch * (2 * matmul_params + attn_flops))


def copy_bandwidth(device, nbytes: int = 1 << 28) -> float:
    """Measured bytes/s of a plain copy (read + write): the memory roof."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = device_timed(lambda: dst.copy_(src), device, reps=5)
    return 2 * nbytes / seconds


def matmul_flops(device, n: int = 2048, dtype=torch.float32) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / device_timed(lambda: a @ b, device, reps=5)


def device_timed(fn, device, warmup: int = 2, reps: int = 10) -> float:
    """Median seconds per call. On CUDA timed with events around each call (the device's own
    clock: a microsecond kernel is shorter than a host sync); elsewhere the harness's median_of."""
    device = torch.device(device)
    if device.type != "cuda":
        return median_of(fn, repeats=reps, warmup=warmup)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def decode_pool(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype,
                device, shuffle: bool = False):
    """A decode step's inputs for timing the kernel: `batch` sequences of `context` tokens in a
    random pool (their pages in order, or shuffled), one query each. Returns (q, k_pool,
    v_pool, block_tables, seq_lens, out, nbytes), nbytes being what the kernel must move."""
    pages = -(-context // block_size)
    k = torch.randn(batch * pages + 1, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    order = torch.randperm if shuffle else torch.arange
    tables = order(batch * pages, device=device, dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    nbytes = 2 * batch * context * kv_heads * head_dim * dtype.itemsize + 2 * q.nbytes + tables.nbytes
    return q, k, v, tables, lens, torch.empty_like(q), nbytes
