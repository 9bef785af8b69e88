"""What every attention backend of this stage shares: its metadata, and the seams beside attention.

Every backend reads stage 03's paged pool through block tables and builds its own metadata
(`build_metadata`): the Triton decode kernel wants its number of splits, the varlen kernel the
longest query for its grid. A step is decode-only (every sequence brings one token) or not
(prefill chunks, verifications), and either runs eagerly (host syncs allowed, exact shapes) or
captured in a CUDA graph (`graphed`: padded shapes, no host sync; graph_runner.py). Beside
attention a backend may offer the fused model its small ops (`fused_ops`), RoPE inside its KV
write (`rotary_forward`), whole decoder layers (`layer_kernels`) and an MoE experts kernel
(`experts_kernel`); the model asks, and never tests types.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch

from course.s01_decode_loop.attention import AttentionBackend
from course.s03_paged.paged_attention import PagedAttentionMetadata, PagedKVCache

from .fused_model import TorchOps


@dataclass
class KernelMetadata(PagedAttentionMetadata):
    max_query_len: int = 1   # host int: the longest new-token run (the prefill kernel's grid)
    is_decode: bool = False  # every sequence brings exactly one token
    num_splits: int = 1      # split-K partitions of the decode kernel (1 = single pass)
    plan: object = None      # the backend's own plan of an eager step (the torch backend's: a StepPlan)
    graphed: bool = False    # built for a captured step: padded shapes, nothing read back to the host


class LayerKernels(ABC):
    """Whole decoder layers in one call each, offered by a backend (the CPU room's C layers): the
    fused model takes them once (`follow`) and asks every step; None: its layers op by op."""

    @abstractmethod
    def step(self, attn, x, cos, sin, meta) -> Callable | None:
        """This step's `run(layer, x, residual) -> (x, residual)`, or None: run it op by op."""

    @abstractmethod
    def logits(self, hidden) -> torch.Tensor | None:
        """The lm_head's product of `hidden`, or None: the model's own lm_head."""


class KernelBackend(AttentionBackend):
    name = "?"
    step_graphed = False        # the step being built is captured (build_metadata's `graphed`)
    fused_ops = TorchOps        # who does the fused model's small ops beside this backend (fused_model.py)
    rotary_in_kv_write = False  # True: `rotary_forward` rotates q and k in the KV write's launch
    # MoE experts for captured steps, whose shapes must not depend on the routing; a room
    # offers them (`register_captured_experts`: the gpu room's blocked layout)
    captured_experts: Callable | None = None

    def __init__(self, cache: PagedKVCache):
        self.cache = cache

    @classmethod
    def from_config(cls, cache: PagedKVCache, config) -> "KernelBackend":  # a backend with options reads them
        return cls(cache)

    def build_metadata(self, *, positions, cu_seqlens_q, seq_lens, slot_mapping, block_tables,
                       max_query_len: int, max_seq_len: int, host_lens=None, graphed: bool = False) -> KernelMetadata:
        """Tensors are views of the runner's persistent buffers; the two ints are host-side
        facts of the step (never read back from the device; for a graphed step, bounds fixed by
        its bucket). `host_lens`: (query lengths, sequence lengths) as host lists, for a
        backend that plans an eager step from them."""
        self.step_graphed = graphed
        return KernelMetadata(positions=positions, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
                              slot_mapping=slot_mapping, block_tables=block_tables,
                              max_query_len=max_query_len, is_decode=max_query_len == 1, graphed=graphed)

    @property
    def experts_kernel(self) -> Callable | None:
        """MoE layers' experts (stage 01's signature). Eager: None, the model's own (rows grouped
        by expert, one product each). Captured: the registered routing-independent kernel."""
        if self.step_graphed and self.captured_experts is None:
            raise ValueError("a captured MoE step needs the gpu room's experts: course.s06_kernels_graphs.gpu.register()")
        return self.captured_experts if self.step_graphed else None

    def layer_kernels(self, model) -> LayerKernels | None:
        """Kernels that run each whole decoder layer of `model` in one call, or None (the
        default): the model calls its ops, and this backend's `forward` for attention."""
        return None

    def rotary_forward(self, layer, q, k, v, cos, sin, meta: KernelMetadata):
        """`forward` for q and k not yet rotated: RoPE (cos, sin [T, D/2]) done in place in the
        KV write's launch. Offered where `rotary_in_kv_write`; the fused model asks once (follow)."""
        raise NotImplementedError(f"the {self.name} backend has no RoPE in its KV write")


def register_captured_experts(kernel: Callable) -> None:
    """A room's MoE experts for captured steps: `kernel(experts, x, weights, ids)`, sync-free."""
    KernelBackend.captured_experts = staticmethod(kernel)
