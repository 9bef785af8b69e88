"""Attention backends behind stage 01's seam, chosen by name from the engine's config.

Both backends read stage 03's paged pool through block tables and build their own metadata
(`build_metadata`), since what a backend needs to know about a step differs: the Triton
decode kernel wants to know how many splits to run, the varlen kernel wants the longest query
for its grid. Two kinds of step exist:

* decode-only (every sequence brings one token): the common case;
* anything else (prefill chunks, mixed batches, speculative verifications).

Either kind may run eagerly (host syncs allowed, exact shapes) or be captured in a CUDA graph
(`graphed`: padded shapes, no host sync; graph_runner.py), so each backend has a sync-free
path for both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from course.s01_decode_loop.attention import AttentionBackend
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course.s01_decode_loop.moe.grouped import grouped_experts


@dataclass
class DecodeGroup:
    rows: torch.Tensor    # [g] rows of q: single-token decodes of similar length
    tables: torch.Tensor  # [g, W] their block tables, cut to the widest of them
    lens: torch.Tensor    # [g] their lengths


@dataclass
class StepPlan:
    """How an eager step's attention splits, worked out once per step (not once per layer):
    decode rows sorted by length and attended to in groups (padding each group only to its own
    longest), prefill chunks one by one."""
    decodes: list[DecodeGroup]
    prefills: list[tuple[int, int, int, int]]  # (sequence, first row, end row, total length) per chunk


@dataclass
class KernelMetadata(PagedAttentionMetadata):
    max_query_len: int = 1   # host int: the longest new-token run (the prefill kernel's grid)
    is_decode: bool = False  # every sequence brings exactly one token
    num_splits: int = 1      # split-K partitions of the decode kernel (1 = single pass)
    plan: object = None      # the backend's own plan of an eager step (the torch backend's: a StepPlan)
    graphed: bool = False    # built for a captured step: padded shapes, nothing read back to the host


class LayerKernels(ABC):
    """Whole decoder layers in one call each, which a backend may offer for a model (the CPU
    room's C layers do, cpu/layer.py). The fused model takes them once (`FusedCausalLM.follow`),
    then asks them every step; where they say None, it runs its layers op by op."""

    @abstractmethod
    def step(self, attn, x, cos, sin, meta) -> Callable | None:
        """This step's `run(layer, x, residual) -> (x, residual)`, or None: run it op by op."""

    @abstractmethod
    def logits(self, hidden) -> torch.Tensor | None:
        """The lm_head's product of `hidden`, or None: the model's own lm_head."""


class KernelBackend(AttentionBackend):
    name = "?"
    step_graphed = False  # the step being built is captured (build_metadata's `graphed`)
    fused_ops = "torch"  # who does the fused model's small ops beside this backend (fused_model.OPS)
    rotary_in_kv_write = False  # True: `rotary_forward` rotates q and k in the KV write's launch

    def __init__(self, cache: PagedKVCache):
        self.cache = cache

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

    def experts_kernel(self, experts, x, weights, ids):
        """MoE layers' experts (stage 01's signature): an eager step's rows grouped by expert,
        one product per expert (stage 04's moe/); a captured step's, whose shapes must not
        depend on the routing, in padded blocks per expert (gpu/fused_moe.py's layout, one bmm)."""
        from .gpu.fused_moe import blocked_experts

        return (blocked_experts if self.step_graphed else grouped_experts)(experts, x, weights, ids)

    def layer_kernels(self, model) -> LayerKernels | None:
        """Kernels that run each whole decoder layer of `model` in one call, or None (the
        default): the model calls its ops, and this backend's `forward` for attention."""
        return None

    def rotary_forward(self, layer, q, k, v, cos, sin, meta: KernelMetadata):
        """`forward` for q and k not yet rotated: RoPE (cos, sin [T, D/2]) done in place in the
        KV write's launch. Offered where `rotary_in_kv_write`; the fused model asks once (follow)."""
        raise NotImplementedError(f"the {self.name} backend has no RoPE in its KV write")


class TorchPagedBackend(KernelBackend):
    """PyTorch only, two paths.

    * Captured steps (graph_runner.py builds their metadata, with no host lengths): every
      sequence's table is gathered at once and masked past its length (and, for a mixed step,
      past each query's position). More bytes than needed, but fixed shapes and no host sync,
      so a CUDA graph can capture it.
    * Eager steps (the runner passes the host lengths): a plan made once per step. Decode rows
      sorted by length go in groups of `decode_group` (each padded only to its own longest),
      prefill chunks one by one, both through torch's fused `scaled_dot_product_attention`.
      On our 2-core CPU, 32 decodes of 100-640 tokens: 13.2 ms per layer gathered at once with
      einsums, 3.8 ms grouped by 8 with SDPA (`python -m course.s06_kernels_graphs.bench.benchmark`).

    `batched=False`: stage 03's per-sequence reference for every eager step."""

    name = "torch"

    def __init__(self, cache: PagedKVCache, batched: bool = True, decode_group: int = 8):
        super().__init__(cache)
        self.reference = PagedAttention(cache)
        self.batched, self.decode_group = batched, decode_group

    def build_metadata(self, *, host_lens=None, **kw) -> KernelMetadata:
        meta = super().build_metadata(**kw)
        if self.batched and not meta.graphed and (host_lens or not meta.is_decode):
            query_lens, lens = host_lens or (meta.query_lens.tolist(), meta.seq_lens.tolist())  # else: one sync
            meta.plan = self.plan_step(meta, query_lens, lens)
        return meta

    def plan_step(self, meta: KernelMetadata, query_lens: list[int], lens: list[int]) -> StepPlan:
        bs, device = self.cache.block_size, meta.seq_lens.device
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        decodes = sorted((b for b, n in enumerate(query_lens) if n == 1), key=lambda b: lens[b])
        groups = []
        for i in range(0, len(decodes), self.decode_group):
            seqs = decodes[i:i + self.decode_group]
            index = torch.tensor(seqs, dtype=torch.long, device=device)
            width = -(-max(lens[b] for b in seqs) // bs)
            groups.append(DecodeGroup(rows=torch.tensor([starts[b] for b in seqs], dtype=torch.long, device=device),
                                      tables=meta.block_tables[index, :width], lens=meta.seq_lens[index]))
        prefills = [(b, starts[b], starts[b + 1], lens[b]) for b, n in enumerate(query_lens) if n > 1]
        return StepPlan(groups, prefills)

    def write_kv(self, layer, k, v, meta: KernelMetadata):
        """The step's new K/V into the layer's pool at their slots; returns the pools."""
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, bs, Hkv, D]
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        return k_pool, v_pool

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        if meta.plan is None and not meta.is_decode and not meta.graphed:
            return self.reference.forward(layer, q, k, v, meta)
        k_pool, v_pool = self.write_kv(layer, k, v, meta)
        if meta.plan is None and meta.is_decode:  # a captured decode step
            return decode_attention_gather(q, k_pool, v_pool, meta.block_tables, meta.seq_lens)
        if meta.plan is None:  # a captured mixed step
            return varlen_attention_gather(q, k_pool, v_pool, meta.cu_seqlens_q, meta.positions,
                                           meta.block_tables, meta.seq_lens)
        out, bs = torch.empty_like(q), self.cache.block_size
        for g in meta.plan.decodes:
            out[g.rows] = decode_attention_sdpa(q[g.rows], k_pool, v_pool, g.tables, g.lens)
        for b, start, end, total in meta.plan.prefills:
            blocks = meta.block_tables[b, : -(-total // bs)]
            k_seq, v_seq = k_pool[blocks].flatten(0, 1)[:total], v_pool[blocks].flatten(0, 1)[:total]
            out[start:end] = causal_attention_sdpa(q[start:end], k_seq, v_seq, q_start=total - (end - start))
        return out


def decode_attention_sdpa(q, k_pool, v_pool, block_tables, seq_lens):
    """decode_attention_gather's math through torch's fused SDPA (grouped query heads
    included): q [B, H, D] -> [B, H, D]."""
    keys = k_pool[block_tables].flatten(1, 2).transpose(1, 2)  # [B, Hkv, W*bs, D]
    values = v_pool[block_tables].flatten(1, 2).transpose(1, 2)
    valid = torch.arange(keys.shape[2], device=q.device)[None, :] < seq_lens[:, None]  # [B, L]
    out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=valid[:, None, None, :],
                                         enable_gqa=True)
    return out[:, :, 0]


def causal_attention_sdpa(q, k, v, q_start: int):
    """Stage 01's causal_attention through torch's fused SDPA: q [Tq, H, D] at positions
    q_start.., k/v [Tk, Hkv, D] at 0..Tk-1."""
    tq, tk = q.shape[0], k.shape[0]
    allowed = torch.arange(tk, device=q.device)[None, :] <= torch.arange(q_start, q_start + tq, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=allowed, enable_gqa=True)
    return out.transpose(0, 1)


def decode_attention_gather(q, k_pool, v_pool, block_tables, seq_lens):
    """q: [B, H, D], one query per sequence at position seq_len-1. Sync-free: every shape comes
    from the block table's width, the lengths only enter through a mask. Table padding must
    hold valid block ids (the runner pads with its dummy block); the pool holds finite values."""
    b, h, d = q.shape
    kv_heads = k_pool.shape[2]
    keys = k_pool[block_tables].flatten(1, 2)  # [B, W*bs, Hkv, D]
    values = v_pool[block_tables].flatten(1, 2)
    qg = q.float().view(b, kv_heads, h // kv_heads, d)  # GQA: query heads grouped by their KV head
    scores = torch.einsum("bngd,blnd->bngl", qg, keys.float()) * d ** -0.5
    past_end = torch.arange(keys.shape[1], device=q.device)[None, :] >= seq_lens[:, None]  # [B, L]
    scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
    out = torch.einsum("bngl,blnd->bngd", scores.softmax(-1), values.float())
    return out.reshape(b, h, d).to(q.dtype)


def varlen_attention_gather(q, k_pool, v_pool, cu_seqlens_q, positions, block_tables, seq_lens):
    """decode_attention_gather for a ragged step: q [T, H, D], rows cu_seqlens_q[b]:[b+1] of
    sequence b at `positions`. Sync-free: each row finds its sequence with a searchsorted on the
    device and sees its sequence's keys up to its own position. Rows of no sequence (bucket
    padding) come out as zeros."""
    t, h, d = q.shape
    num_seqs, kv_heads = seq_lens.shape[0], k_pool.shape[2]
    rows = torch.arange(t, device=q.device)
    seq = torch.searchsorted(cu_seqlens_q[1:], rows, right=True)  # [T]: the sequence of each row
    owned = seq < num_seqs
    seq = seq.clamp(max=num_seqs - 1)
    keys = k_pool[block_tables[seq]].flatten(1, 2)  # [T, W*bs, Hkv, D]
    values = v_pool[block_tables[seq]].flatten(1, 2)
    qg = q.float().view(t, kv_heads, h // kv_heads, d)
    scores = torch.einsum("tngd,tlnd->tngl", qg, keys.float()) * d ** -0.5
    span = torch.arange(keys.shape[1], device=q.device)[None, :]
    visible = (span <= positions[:, None]) & (span < seq_lens[seq][:, None]) & owned[:, None]  # [T, L]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.where(visible[:, None, None, :], scores.softmax(-1), 0.)  # an all-masked row: 0, not NaN
    out = torch.einsum("tngl,tlnd->tngd", weights.nan_to_num(0.), values.float())
    return out.reshape(t, h, d).to(q.dtype)


class TritonPagedBackend(KernelBackend):
    """Stage 06's kernels: the KV scatter, then the attention launches of each layer. Beside
    the fused model the scatter applies RoPE too (`rotary_forward`): one launch instead of two.

    kernels="lesson": this folder's kernels, written to be read. The decode kernel (split-K
    for long contexts) when every sequence decodes, else the varlen kernel, which takes
    prefill chunks and decodes side by side, its grid sized by the longest query.
    kernels="gpu" (the default): the gpu/ room's kernels, built for a Hopper GPU. Tensor-core
    decode with split-KV per request; a mixed step launches both kernels on the same q and out,
    the prefill kernel on the chunks (own keys from the fresh projection) and the decode
    kernel on the single-token rows, each with a grid that depends on shapes alone."""

    name = "triton"
    fused_ops = "triton"
    rotary_in_kv_write = True
    KERNELS = ("gpu", "lesson")

    def __init__(self, cache: PagedKVCache, num_splits: int | None = None, kernels: str = "gpu"):
        super().__init__(cache)
        if kernels not in self.KERNELS:
            raise ValueError(f"unknown triton kernels {kernels!r}; choose one of {list(self.KERNELS)}")
        self.num_splits, self.kernels = num_splits, kernels  # num_splits None: chosen per step from the shape
        self.num_sms = (torch.cuda.get_device_properties(cache.k.device).multi_processor_count
                        if cache.k.is_cuda else 1)  # the interpreter gains nothing from splits

    def build_metadata(self, *, max_seq_len: int, **kw) -> KernelMetadata:
        from .decode_attention import choose_num_splits
        from .gpu.decode_attention import choose_max_splits

        meta = super().build_metadata(max_seq_len=max_seq_len, **kw)
        max_blocks = -(-max_seq_len // self.cache.block_size)
        choose = choose_max_splits if self.kernels == "gpu" else choose_num_splits
        meta.num_splits = self.num_splits or choose(meta.num_seqs, self.cache.k.shape[3], max_blocks, self.num_sms)
        return meta

    def experts_kernel(self, experts, x, weights, ids):
        """MoE layers: the fused MoE kernel, two grouped launches for every expert (gpu/fused_moe.py)."""
        from .gpu.fused_moe import fused_moe

        return fused_moe(experts, x, weights, ids)

    def forward(self, layer, q, k, v, meta: KernelMetadata):
        from .kv_write import write_kv

        write_kv(k, v, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping)
        return self.attend(layer, q, k, v, meta)

    def rotary_forward(self, layer, q, k, v, cos, sin, meta: KernelMetadata):
        from .rotary import apply_rotary_and_write_kv

        apply_rotary_and_write_kv(q, k, v, cos, sin, self.cache.k[layer], self.cache.v[layer], meta.slot_mapping)
        return self.attend(layer, q, k, v, meta)

    def attend(self, layer, q, k, v, meta: KernelMetadata):
        """The attention launches, this step's K/V already in the pool."""
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]
        out = torch.zeros_like(q) if meta.graphed else torch.empty_like(q)  # bucket padding rows: zeros
        if self.kernels == "lesson":
            return self._lesson(q, k_pool, v_pool, meta, out)
        from .gpu.decode_attention import paged_decode_attention
        from .gpu.prefill_attention import varlen_attention

        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          max_splits=meta.num_splits, out=out)
        varlen_attention(q, k, v, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables,
                         out=out, skip_decodes=True)
        return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                      query_start=meta.cu_seqlens_q, max_splits=meta.num_splits, out=out)

    @staticmethod
    def _lesson(q, k_pool, v_pool, meta: KernelMetadata, out):
        from .decode_attention import paged_decode_attention
        from .prefill_attention import varlen_paged_attention

        if meta.is_decode:
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.seq_lens,
                                          num_splits=meta.num_splits, out=out)
        return varlen_paged_attention(q, k_pool, v_pool, meta.cu_seqlens_q, meta.seq_lens,
                                      meta.block_tables, meta.max_query_len, out=out)


def cpu_backend(cache: PagedKVCache, **options) -> KernelBackend:
    """The CPU room's backend (cpu/backend.py: its C kernel and its one-call layers)."""
    from .cpu.backend import CpuPagedBackend
    return CpuPagedBackend(cache, **options)


BACKENDS = {"torch": TorchPagedBackend, "cpu": cpu_backend, "triton": TritonPagedBackend}


def make_backend(name: str, cache: PagedKVCache, **options) -> KernelBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](cache, **options)
