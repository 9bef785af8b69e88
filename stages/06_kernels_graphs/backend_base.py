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

from dataclasses import dataclass
from typing import Callable

from course.s01_decode_loop.attention import AttentionBackend
from course.s03_paged.paged_attention import PagedAttentionMetadata, PagedKVCache

from .fused_model import TorchOps


@dataclass
class KernelMetadata(PagedAttentionMetadata):
    max_query_len: int = 1   # host int: the longest new-token run (the prefill kernel's grid)
    is_decode: bool = False  # every sequence brings exactly one token
    num_splits: int = 1      # split-K partitions of the decode kernel (1 = single pass)
    plan: object = None      # a backend's own plan of an eager step, from `host_lens` (the cpu room's)
    graphed: bool = False    # built for a captured step: padded shapes, nothing read back to the host
    trees: dict | None = None  # sequence -> [n, n] bool: its chunk is a speculative tree (row i sees j)


class KernelBackend(AttentionBackend):
    name = "?"
    step_graphed = False        # the step being built is captured (build_metadata's `graphed`)
    fused_ops = TorchOps        # who does the fused model's small ops beside this backend (fused_model.py)
    rotary_in_kv_write = False  # True: it offers `rotary_forward`, `forward` with RoPE in the KV write's launch
    tree_masks = False          # True: eager steps may hold speculative trees (`build_metadata`'s `trees`)
    captured_experts: Callable | None = None  # MoE experts of captured steps: a room's (gpu/)
    stored_kv: tuple | None = None  # pool dtypes it reads besides the model's (None: all stage 03 stores)
    serves_windows = False      # True: its kernels mask each sliding layer's window (config.layer_windows)

    def __init__(self, cache: PagedKVCache):
        if cache.kv_dtype != cache.dtype and self.stored_kv is not None and cache.kv_dtype not in self.stored_kv:
            also = "".join(f" or {str(t).removeprefix('torch.')}" for t in self.stored_kv)
            raise ValueError(f"the {self.name} backend reads K/V pools of the model's dtype ({cache.dtype}){also}, "
                             f"not {cache.kv_dtype}: every --kv-cache-dtype runs on the torch and cpu backends")
        if cache.windows and not self.serves_windows:
            raise ValueError(f"the {self.name} backend does not attend sliding windows, which this model's "
                             "layers use: run it on the torch backend")
        self.cache = cache
        self.windows = cache.windows

    @classmethod
    def from_config(cls, cache: PagedKVCache, config) -> "KernelBackend":  # a backend with options reads them
        return cls(cache)

    def build_metadata(self, *, positions, cu_seqlens_q, seq_lens, slot_mapping, block_tables,
                       max_query_len: int, max_seq_len: int, host_lens=None, graphed: bool = False,
                       trees: dict | None = None) -> KernelMetadata:
        """Tensors are views of the runner's persistent buffers; the two ints are host-side
        facts of the step (never read back from the device; for a graphed step, bounds fixed by
        its bucket). `host_lens`: (query lengths, sequence lengths) as host lists, for a
        backend that plans an eager step from them. `trees`: the sequences whose chunk is a
        speculative tree, each with its [n, n] mask (a backend with `tree_masks` only)."""
        if trees and not self.tree_masks:
            raise ValueError(f"the {self.name} backend does not attend speculative trees")
        self.step_graphed = graphed
        return KernelMetadata(positions=positions, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
                              slot_mapping=slot_mapping, block_tables=block_tables,
                              max_query_len=max_query_len, is_decode=max_query_len == 1, graphed=graphed,
                              trees=trees or None)

    @property
    def experts_kernel(self) -> Callable | None:
        """MoE layers' experts (stage 01's signature). Eager: None, the model's own (rows grouped
        by expert, one product each, shapes that depend on the routing). Captured: the registered one."""
        return self.captured_experts if self.step_graphed else None

    def layer_kernels(self, model):
        """Whole decoder layers of `model` in one call each (the cpu room's C layers), asked once
        (`follow`); None (the default): the model calls its ops, and `forward` for attention.
        Every step the model asks them `step(attn, x, cos, sin, meta)` for that step's
        `run(layer, x, residual) -> (x, residual)`, and `logits(hidden)` for the lm_head's
        product; a None answer: its own ops, its own lm_head."""
        return None


def register_captured_experts(kernel: Callable) -> None:
    """A room's sync-free MoE experts of captured steps (experts, x, weights, ids): routing-free shapes."""
    KernelBackend.captured_experts = staticmethod(kernel)
