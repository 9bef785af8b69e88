"""The cpu attention backend: every row of every step through attention.c, read straight from
the pool, and, where `one_call_layers` allows, each whole decoder layer in one C call (layer.py).

It is the torch backend's metadata and KV write with its own plan (planned.py's `plan_step`):
the rows the C kernel attends, one call per layer. It offers its one-call layers through the
backend seam (`layer_kernels`), so the fused model never needs to know which backend it runs with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.s03_paged.paged_attention import PagedKVCache

from course.s01_decode_loop.moe.grouped import grouped_experts

from ..backend_base import KernelMetadata
from .ops import CpuOps
from .planned import PlannedBackend


@dataclass
class NativeRows:
    """Rows the CPU kernel attends in one call: row `rows[i]` of q to the first `lens[i]`
    tokens of sequence `seqs[i]` (for a row of a chunk, the tokens up to its own position);
    a speculative tree's rows only to their path among the tree's keys (attention.c). A sliding
    layer narrows each row to its window, the tree rows with their bits narrowed too (`bits`)."""
    rows: torch.Tensor
    seqs: torch.Tensor
    lens: torch.Tensor
    tree_first: torch.Tensor | None = None  # [n] where the row's tree block starts (lens: no tree)
    tree_bits: torch.Tensor | None = None   # [n] bit j: the row sees key tree_first + j
    window_bits: dict | None = None         # window -> tree_bits narrowed to it (the sliding layers')

    def bits(self, window: int | None) -> torch.Tensor | None:
        """The tree bits a layer with this window (None: full attention) attends with."""
        return self.tree_bits if window is None or self.window_bits is None else self.window_bits[window]


def tree_bits(mask: torch.Tensor, window: int | None = None) -> list[int]:
    """A tree block's [n, n] mask (row i may see block row j) as one int64 bit set per row. With
    a sliding `window`, less the ancestors `window` or more levels above the row: a node's depth is
    its own path's length less one, which the kernel, given only the row's bits, cannot know."""
    if window is not None:
        depth = mask.sum(1) - 1
        mask = mask & (depth[:, None] - depth[None, :] < window)
    bits = []
    for row in mask.tolist():
        value = sum(1 << j for j, seen in enumerate(row) if seen)
        bits.append(value - (1 << 64) if value >= 1 << 63 else value)  # as int64: the C reads uint64
    return bits


class CpuPagedBackend(PlannedBackend):
    """Float32 on the CPU: decode rows, the k+1 rows of a speculative verification and prefill
    chunks alike, in one call per layer. A row of a chunk attends to the tokens up to its own
    position, which is the causal mask; in a sliding layer, only to the last `window` of them. One
    layer on a 2-core CPU, 32 decodes of 100-300 tokens: the C kernel against grouped SDPA,
    `results/bench_cpu_kernels.json` (bench_cpu_kernels.py)."""

    name = "cpu"
    tree_masks = True   # a speculative tree's rows attend to their paths only (attention.c)
    serves_windows = True   # attention.c takes each sliding layer's window
    takes_sinks = True      # and each layer's sinks (gpt-oss): one more term in every head's softmax
    fused_ops = CpuOps  # ops.c's norm, RoPE and SwiGLU for the per-op path

    def __init__(self, cache: PagedKVCache, one_call_layers: bool = True):
        from .attention import check_shapes, kernel_unavailable

        super().__init__(cache)
        self.one_call_layers = one_call_layers
        reason = kernel_unavailable()
        if reason:
            raise ValueError(f"the cpu attention backend needs its C kernel: {reason}; use the torch backend")
        check_shapes(cache.pools(0)[0])

    @classmethod
    def from_config(cls, cache: PagedKVCache, config) -> "CpuPagedBackend":
        return cls(cache, config.one_call_layers)

    def layer_kernels(self, model):
        """layer.py's one-call layers, where `one_call_layers` asks for them and the C covers the
        model (float32 or int8 weights, no biases, a compiler here); else None."""
        from .layer import CpuLayers

        return CpuLayers.of(model, self) if self.one_call_layers else None

    @property
    def experts_kernel(self):
        """MoE layers of an eager float32 step: stage 01's grouped experts, each expert's rows
        through layer.c's products (the dense layers' own: blocked up to 64 rows, MKL past)."""
        from .layer import layer_kernel_unavailable, product

        if self.step_graphed or self.cache.dtype != torch.float32 or layer_kernel_unavailable() is not None:
            return super().experts_kernel
        return lambda experts, x, weights, ids: grouped_experts(experts, x, weights, ids, linear=product)

    def plan_step(self, meta: KernelMetadata, query_lens: list[int], lens: list[int]) -> NativeRows:
        seqs, row_lens = [], []
        for b, (n, total) in enumerate(zip(query_lens, lens)):
            seqs += [b] * n
            row_lens += range(total - n + 1, total + 1)  # causal: each row sees up to itself
        device = meta.seq_lens.device
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        rows = NativeRows(torch.arange(len(seqs), device=device), as_tensor(seqs), as_tensor(row_lens))
        if meta.trees:  # only a step with trees pays for their rows
            firsts, bits = [], {w: [] for w in {None, *self.windows}}  # per window the layers slide over
            for b, (n, total) in enumerate(zip(query_lens, lens)):
                mask = meta.trees.get(b)
                firsts += [total - n] * n if mask is not None else range(total - n + 1, total + 1)
                for window, narrowed in bits.items():
                    narrowed += tree_bits(mask, window) if mask is not None else [0] * n
            rows.tree_first, rows.tree_bits = as_tensor(firsts), as_tensor(bits.pop(None))
            rows.window_bits = {window: as_tensor(narrowed) for window, narrowed in bits.items()} or None
        return rows

    def rows(self, meta: KernelMetadata) -> NativeRows:
        """The step's rows: its plan; for a captured step (no host lengths), found on the device."""
        if meta.plan is None and not meta.is_decode:  # a mixed step: each row's sequence by searchsorted
            every = torch.arange(meta.positions.shape[0], device=meta.positions.device)
            seqs = torch.searchsorted(meta.cu_seqlens_q[1:], every, right=True)
            return NativeRows(every, seqs.clamp(max=meta.seq_lens.shape[0] - 1), meta.positions + 1)
        if meta.plan is None:
            every = torch.arange(meta.seq_lens.shape[0], device=meta.seq_lens.device)
            return NativeRows(every, every, meta.seq_lens)
        return meta.plan

    def forward(self, layer, q, k, v, meta: KernelMetadata, sinks=None):
        from .attention import paged_attention_rows

        k_pool, v_pool = self.write_kv(layer, k, v, meta)
        rows, window = self.rows(meta), self.window(layer)
        return paged_attention_rows(q, k_pool, v_pool, meta.block_tables, rows.rows, rows.seqs, rows.lens,
                                    tree_first=rows.tree_first, tree_bits=rows.bits(window), window=window,
                                    sinks=sinks)
