"""The Triton backend: this stage's kernels behind the attention seam.

Each layer scatters the step's K/V into the pool (kv_write.py; beside the fused model, in the
same launch as RoPE: `rotary_forward`), then launches the attention of its *kernel set*:
"lesson", this folder's kernels (the decode kernel, split-K for long contexts, when every
sequence decodes; else the varlen kernel, prefill chunks and decodes in one launch), or a set
a room registers (`register_kernel_set`: the gpu room's tensor-core "gpu"). A set chooses a
step's decode splits, launches its attention, and may bring an MoE experts kernel.
"""
from __future__ import annotations

import torch

from course.s03_paged.paged_attention import PagedKVCache

from .backend_base import KernelBackend, KernelMetadata
from .fused_model import TritonOps


class LessonKernels:
    name = "lesson"
    experts = None  # MoE layers: the model's own experts (eager), the registered captured ones

    @staticmethod
    def num_splits(num_seqs: int, num_kv_heads: int, max_blocks: int, num_sms: int) -> int:
        from .decode_attention import choose_num_splits
        return choose_num_splits(num_seqs, num_kv_heads, max_blocks, num_sms)

    @staticmethod
    def attend(q, k, v, k_pool, v_pool, meta: KernelMetadata, out) -> torch.Tensor:
        from .decode_attention import paged_decode_attention
        from .prefill_attention import varlen_paged_attention

        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          num_splits=meta.num_splits, out=out)
        return varlen_paged_attention(q, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens,
                                      meta.block_tables, meta.max_query_len, out=out)


KERNEL_SETS: dict[str, type] = {"lesson": LessonKernels}


def register_kernel_set(kernels: type) -> None:
    """A room's kernel set, chosen by its `name` (`KernelEngineConfig.triton_kernels`)."""
    KERNEL_SETS[kernels.name] = kernels


class TritonPagedBackend(KernelBackend):
    name = "triton"
    fused_ops = TritonOps
    rotary_in_kv_write = True

    def __init__(self, cache: PagedKVCache, num_splits: int | None = None, kernels: str = "lesson"):
        super().__init__(cache)
        if kernels not in KERNEL_SETS:
            raise ValueError(f"unknown triton kernels {kernels!r}; choose one of {sorted(KERNEL_SETS)} "
                             "(the gpu set needs its room registered: course.s06_kernels_graphs.gpu.register())")
        self.kernels = KERNEL_SETS[kernels]
        self.num_splits = num_splits  # None: chosen per step from the shape
        self.num_sms = (torch.cuda.get_device_properties(cache.k.device).multi_processor_count
                        if cache.k.is_cuda else 1)  # the interpreter gains nothing from splits

    @classmethod
    def from_config(cls, cache: PagedKVCache, config) -> "TritonPagedBackend":
        return cls(cache, config.num_splits, config.triton_kernels)

    def build_metadata(self, *, max_seq_len: int, **kw) -> KernelMetadata:
        meta = super().build_metadata(max_seq_len=max_seq_len, **kw)
        max_blocks = -(-max_seq_len // self.cache.block_size)
        meta.num_splits = self.num_splits or self.kernels.num_splits(meta.num_seqs, self.cache.k.shape[3], max_blocks,
                                                                     self.num_sms)
        return meta

    @property
    def experts_kernel(self):
        return self.kernels.experts or super().experts_kernel

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        from .kv_write import write_kv

        write_kv(k, v, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping)
        return self.attend(layer, q, k, v, meta)

    def rotary_forward(self, layer, q, k, v, cos, sin, meta: KernelMetadata):
        from .rotary import apply_rotary_and_write_kv

        apply_rotary_and_write_kv(q, k, v, cos, sin, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping)
        return self.attend(layer, q, k, v, meta)

    def attend(self, layer, q, k, v, meta: KernelMetadata):
        """The kernel set's attention launches, this step's K/V already in the pool."""
        out = torch.zeros_like(q) if meta.graphed else torch.empty_like(q)  # bucket padding rows: zeros
        return self.kernels.attend(q, k, v, self.cache.k[layer], self.cache.v[layer], meta, out)
