"""The room's kernels as a kernel set of the Triton backend (`triton_kernels="gpu"`).

A decode step launches the tensor-core decode kernel alone. A mixed step launches both kernels
on the same q and out: the prefill kernel on the chunks (their own keys from the fresh
projection, `skip_decodes`), the decode kernel on the single-token rows (`query_start`), each
with a grid that depends on shapes alone, so any step can be captured. MoE layers take the
fused MoE kernel, eager or captured; RoPE and the KV write share one launch (rotary_kv_write.py).
Both attention kernels take the layer's sliding window (None: full attention) and its attention
sinks (gpt-oss's [H] logits; None: none).
"""
from __future__ import annotations

import torch

from .decode_attention import choose_max_splits, paged_decode_attention
from .fused_moe import fused_moe
from .prefill_attention import varlen_attention
from .rotary_kv_write import apply_rotary_and_write_kv


class GpuKernels:
    name = "gpu"
    experts = staticmethod(fused_moe)
    rotary_write_kv = staticmethod(apply_rotary_and_write_kv)
    num_splits = staticmethod(choose_max_splits)  # an upper bound: each request takes what its length needs
    scaled_kv = False  # pools of the model's dtype only (int8 KV: the lesson's set)

    @staticmethod
    def attend(q, k, v, k_pool, v_pool, meta, out, window=None, sinks=None) -> torch.Tensor:
        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          max_splits=meta.num_splits, out=out, window=window, sinks=sinks)
        varlen_attention(q, k, v, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables,
                         out=out, skip_decodes=True, window=window, sinks=sinks)
        return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                      query_start=meta.cu_seqlens_q, max_splits=meta.num_splits, out=out,
                                      window=window, sinks=sinks)
