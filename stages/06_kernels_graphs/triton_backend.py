"""The Triton backend: this stage's kernels behind the attention seam.

Each layer scatters the step's K/V into the pool (kv_write.py), then launches the attention of
its *kernel set*: "lesson", this folder's kernels (the decode kernel, split-K for long contexts,
when every sequence decodes; else the varlen kernel, prefill chunks and decodes in one launch),
or a room's (`register_kernel_set`: the gpu room's "gpu"). A set chooses a step's decode splits,
launches its attention, and may bring MoE experts and RoPE folded into the KV write (`rotary_forward`).
"""
from __future__ import annotations

from importlib import import_module

import torch

from course.s03_paged.paged_attention import PagedKVCache

from .backend_base import KernelBackend, KernelMetadata


def triton_op(module: str, name: str):
    """`name` of this stage's Triton module `module`, imported at each call: Triton is installed on
    Linux only, so the backends must import without it (and a test may swap the function)."""
    return staticmethod(lambda *args: getattr(import_module(f"{__package__}.{module}"), name)(*args))


class TritonOps:  # fused_model.py's TorchOps, each op one Triton launch
    rms_norm = triton_op("fused_norm", "rms_norm")
    add_rms_norm = triton_op("fused_norm", "fused_add_rms_norm")
    rotary_ = triton_op("rotary", "apply_rotary_")
    silu_mul = triton_op("silu_mul", "silu_mul")


class LessonKernels:
    name = "lesson"
    num_splits = triton_op("decode_attention", "choose_num_splits")  # (sequences, KV heads, max blocks, SMs)
    experts = None  # MoE layers: the model's own experts (eager), the registered captured ones
    rotary_write_kv = None  # RoPE and the KV write in one launch; None: rotary.py's, then kv_write.py's
    scaled_kv = True  # its attention reads int8 codes with their scales (a room writes them)

    @staticmethod
    def attend(q, k, v, k_pool, v_pool, meta: KernelMetadata, out, *scales, window=None, sinks=None) -> torch.Tensor:
        from .decode_attention import paged_decode_attention
        from .prefill_attention import varlen_paged_attention

        kw = dict(zip(("k_scale", "v_scale"), scales), window=window, sinks=sinks)  # int8 pool scales; the layer's
        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          num_splits=meta.num_splits, out=out, **kw)
        return varlen_paged_attention(q, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens,
                                      meta.block_tables, meta.max_query_len, out=out, **kw)


KERNEL_SETS: dict[str, type] = {"lesson": LessonKernels}
STORED_KV_WRITES: dict = {}  # pool dtype -> a room's KV write into such a pool (int8_kv/)


def register_stored_kv_write(dtype: torch.dtype, write) -> None:
    """A room's `write(k, v, codes_k, codes_v, slots, scales_k, scales_v)` for pools of `dtype`."""
    STORED_KV_WRITES[dtype] = write


def register_kernel_set(kernels: type) -> None:
    """A room's kernel set, chosen by its `name` (`KernelEngineConfig.triton_kernels`); its
    `attend` takes the layer's sliding `window` and `sinks` too."""
    KERNEL_SETS[kernels.name] = kernels


class TritonPagedBackend(KernelBackend):
    name = "triton"
    fused_ops = TritonOps
    serves_windows = takes_sinks = True  # every kernel set masks a sliding layer's window, adds gpt-oss's sinks

    def __init__(self, cache: PagedKVCache, num_splits: int | None = None, kernels: str = "lesson"):
        if kernels not in KERNEL_SETS:
            raise ValueError(f"unknown triton kernels {kernels!r}; choose one of {sorted(KERNEL_SETS)} "
                             "(the gpu set needs its room registered: course.s06_kernels_graphs.gpu.register())")
        self.kernels = KERNEL_SETS[kernels]
        self.stored_kv = tuple(STORED_KV_WRITES) if getattr(self.kernels, "scaled_kv", False) else ()
        super().__init__(cache)
        self.rotary_in_kv_write = self.kernels.rotary_write_kv is not None  # the fused model asks (follow)
        self.num_splits = num_splits  # None: chosen per step from the shape
        self.num_sms = (torch.cuda.get_device_properties(cache.k[0].device).multi_processor_count
                        if cache.k[0].is_cuda else 1)  # the interpreter gains nothing from splits

    @classmethod
    def from_config(cls, cache: PagedKVCache, config) -> "TritonPagedBackend":
        return cls(cache, config.num_splits, config.triton_kernels)

    def build_metadata(self, *, max_seq_len: int, **kw) -> KernelMetadata:
        meta = super().build_metadata(max_seq_len=max_seq_len, **kw)
        max_blocks = -(-max_seq_len // self.cache.block_size)
        meta.num_splits = self.num_splits or self.kernels.num_splits(meta.num_seqs, self.cache.k[0].shape[2], max_blocks,
                                                                     self.num_sms)
        return meta

    @property
    def experts_kernel(self):
        return self.kernels.experts or super().experts_kernel

    def forward(self, layer, q, k, v, meta: KernelMetadata, sinks=None):
        from .kv_write import write_kv

        write = STORED_KV_WRITES[self.cache.kv_dtype] if self.cache.quantized else write_kv
        write(k, v, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping, *self.scales(layer))
        return self.attend(layer, q, k, v, meta, sinks)

    def scales(self, layer) -> tuple:
        """An int8 pool's K and V scales of the layer; none for a float pool."""
        return (self.cache.k_scale[layer], self.cache.v_scale[layer]) if self.cache.quantized else ()

    def rotary_forward(self, layer, q, k, v, cos, sin, meta: KernelMetadata, sinks=None):
        """`forward` for q and k not yet rotated (cos, sin [T, D/2]): the set's RoPE in the KV write."""
        self.kernels.rotary_write_kv(q, k, v, cos, sin, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping)
        return self.attend(layer, q, k, v, meta, sinks)

    def attend(self, layer, q, k, v, meta: KernelMetadata, sinks=None):
        """The set's attention, K/V in the pool; a captured step bakes in the window and the sinks' address."""
        out = torch.zeros_like(q) if meta.graphed else torch.empty_like(q)  # bucket padding rows: zeros
        return self.kernels.attend(q, k, v, self.cache.k[layer], self.cache.v[layer], meta, out, *self.scales(layer),
                                   window=self.window(layer), sinks=sinks)
