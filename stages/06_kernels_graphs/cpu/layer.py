"""A decoder layer in one C call (layer.c), and the lm_head's product.

On the CPU a decode step is 30 layers of four matrix products plus the small work between them.
The products are bounded by how fast the weights stream from memory (few rows) or by arithmetic
(many); the small work is bounded by Python: ~10 calls per layer (norms, RoPE, the KV write,
attention, SiLU, module calls and views), ~0.15 ms a layer, a fifth of a single stream's step
and a tenth of a saturated one. `LayerCalls` runs each layer as one ctypes call instead, with
everything between the products in C. The products of up to BLOCKED_ROWS rows are
layer.c's register-blocked kernel, which beats torch's `bmm` and MKL there (it streams
each weight once, and keeps both FMA units busy from 4 rows on); bigger float32 ones are the
`sgemm_` of torch's own MKL, whose address is handed to the C (bench_cpu_kernels.py prints
the ratios), or, where oneDNN's matmul is timed faster (onednn.py: AMD hosts), the whole step
runs op by op so the split linears can call it.

The cpu attention backend offers these layers through the backend seam (`CpuLayers`, from its
`layer_kernels`) where the C covers the model: float32 or int8 (int8_linear.py's) weights
without biases. Anything else (bf16, biases) takes the per-op path, which is also the
reference its tests use. With int8
weights the products read a quarter of the bytes; with AVX-512 VNNI they are integer products
on activation rows rounded to int16 (int8.c), else the int8 weights are widened to float32.

    python -m course.s06_kernels_graphs.cpu.bench_cpu_kernels   # the products against bmm and MKL
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import nn

from . import native
from .attention import KV_KINDS
from .int8_linear import Int8Linear, quantize_rows
from .onednn import MANY_ROWS, onednn_product, takes
from .split_linear import SplitLinear

SOURCE = Path(__file__).with_name("layer.c")
FLAGS = native.BASE_FLAGS + ["-ffast-math"]  # what attention.c, included, needs
# Rows up to which layer.c's blocked kernel beats the sgemm of torch's own MKL on our 2-core
# CPU (bench_cpu_kernels.py: 1.7-1.9x at 4-8 rows, 1.4x at 16, 1.2x at 32 and 64, 0.98x at 128:
# a GEMM's cache blocking over k wins there). Past it the C layer calls that sgemm for float32
# weights (int8 ones, and float32 ones where torch has no sgemm_, stay in the blocked kernel).
BLOCKED_ROWS = MANY_ROWS  # onednn.py's: the same rows decide between its GEMMs and ours


@native.cached_loader
def _library():
    lib = native.load(SOURCE, FLAGS)
    ptr, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.product_f32.argtypes = [ptr, ptr, ptr, i64, i64, i64, i32]
    lib.product_f32.restype = None
    lib.product_i8_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i32]
    lib.product_i8_f32.restype = None
    lib.decoder_layer_f32.argtypes = [i64] * 6 + [f32] + [ptr] * 15 + [ptr, ptr, i32, ptr, ptr, i64, i64, ptr] + \
        [ptr, ptr, ptr, i64, ptr, ptr, i64, ptr, i64, ptr, i32]
    lib.decoder_layer_f32.restype = i64
    lib.set_sgemm.argtypes = [ptr, i64]
    lib.set_sgemm.restype = None
    lib.set_sgemm(_torch_sgemm(), BLOCKED_ROWS)
    return lib


@functools.lru_cache(maxsize=None)
def _torch_sgemm() -> int | None:
    """The address of the BLAS sgemm_ inside torch's CPU library (MKL on x86), or None."""
    try:
        return ctypes.cast(ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).sgemm_,
                           ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def layer_kernel_unavailable() -> str | None:
    return native.unavailable(_library)


def layer_weight(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, None) for a bias-free float32 nn.Linear or SplitLinear, (int8 weight, float32
    row scales) for a bias-free Int8Linear; None for anything the C does not take."""
    if linear.bias is not None:
        return None
    if type(linear) in (nn.Linear, SplitLinear):
        w = linear.weight
        ok = w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous()
        return (w, None) if ok else None
    if type(linear) is Int8Linear and linear.qweight.device.type == "cpu":
        return linear.qweight.contiguous(), linear.scale.float().contiguous()
    return None


def product(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [m, k] @ weight[n, k].T through layer.c (float32 x); weight float32,
    or int8 with one float32 scale per row."""
    x = x.contiguous()
    if scale is None and takes(x.shape[0], weight):
        return onednn_product(x, weight)   # many rows (a prompt's logprobs): onednn.py
    out = x.new_empty(x.shape[0], weight.shape[0])
    m, (n, k), threads = x.shape[0], weight.shape, torch.get_num_threads()
    if scale is None:
        _library().product_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, n, k, threads)
    else:
        _library().product_i8_f32(x.data_ptr(), weight.data_ptr(), scale.data_ptr(), out.data_ptr(), m, n, k, threads)
    return out


class LayerWeights:
    """A layer's four weights (QKV, o, gate-up, down) as layer.c takes them, gathered once:
    the tensors, and the scales' pointers in the array the C reads (NULL: float32 weights)."""

    def __init__(self, weights):
        self.weights = [w for w, _ in weights]
        self.scale_tensors = [s for _, s in weights]  # kept alive for the pointers below
        self.scales = (ctypes.c_void_p * 4)(*[s.data_ptr() if s is not None else None for s in self.scale_tensors])

    @classmethod
    def of(cls, layer) -> "LayerWeights | None":
        if layer.moe is not None:  # the C layer has no experts: an MoE layer runs op by op
            return None
        weights = [layer_weight(linear) for linear in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)]
        return cls(weights) if all(w is not None for w in weights) else None


class CpuLayers:
    """The cpu backend's layer kernels for one fused model (backend.py's `layer_kernels`, whose
    `step` and `logits` the fused model asks): every layer's weights as the C takes them,
    gathered once, and the buffer every step reuses."""

    def __init__(self, model, backend, weights: list[LayerWeights]):
        self.backend, self.weights, self.config = backend, weights, model.config
        self.head = layer_weight(model.lm_head)  # None: the lm_head is not the C's kind
        first = model.layers[0]
        self.qkv_width, self.attn_width = (first.n_heads + 2 * first.n_kv) * first.d, first.n_heads * first.d
        self.scratch = None  # kept between steps: big steps would page-fault anew
        # the fused model's own ops could do a step's GEMMs in oneDNN: float32 split linears
        self.gemms_by_ops = all(type(m) is SplitLinear for m in (first.qkv, first.o_proj, first.gate_up, first.down_proj))
        self._draft_rows = None  # (float rows, their int8 codes, scales): draft_product's

    @classmethod
    def of(cls, model, backend) -> "CpuLayers | None":
        """None where the C does not cover the model (bf16 weights, biases) or cannot compile here."""
        if layer_kernel_unavailable() is not None:
            return None
        weights = [LayerWeights.of(layer) for layer in model.layers]
        return cls(model, backend, weights) if all(weights) else None

    def step(self, attn, x, cos, sin, meta):
        """The step's LayerCalls.run, for this backend's steps with float32 activations; None
        (the fused model's own ops) for a step of many rows whose GEMMs oneDNN does faster
        than the sgemm the C layer would call (onednn.py: the split linears take it there)."""
        if attn is not self.backend or x.dtype != torch.float32:
            return None
        if self.gemms_by_ops and takes(x.shape[0], self.weights[0].weights[0]):
            return None
        return LayerCalls(self, x, cos, sin, meta).run

    def logits(self, hidden):
        if self.head is None or hidden.dtype != torch.float32:
            return None
        return product(hidden, *self.head)

    def draft_product(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x [m, k] @ rows[n, k].T for a draft's float32 rows of the lm_head (an EAGLE head's
        draft vocabulary): as int8 rows (quantized on first use, as a draft's linears are) on
        every core; torch's `linear` would run it on one."""
        if self._draft_rows is None or self._draft_rows[0] is not rows:
            self._draft_rows = (rows, *quantize_rows(rows))
        return product(x, *self._draft_rows[1:])


class LayerCalls:
    """One forward's setup for the one-call layers: the step's metadata as pointers, and the
    buffers every layer reuses. `run(layer, x, residual)` returns what FusedLayer.forward
    returns."""

    def __init__(self, kernels: CpuLayers, x, cos, sin, meta):
        m, c = x.shape[0], kernels.config
        self.m, self.hidden, self.inter, self.weights = m, c.hidden_size, c.intermediate_size, kernels.weights
        pools = kernels.backend.cache  # each layer's K/V pool by address: base + layer * stride (a select per layer costs ~4 us)
        self.block_size, self.num_blocks, self.kv_kind = pools.block_size, pools.k.shape[1], KV_KINDS[pools.k.dtype]
        parts = pools.tensors()
        assert all(t.is_contiguous() for t in parts)
        # (base address, bytes per layer) of the K and V pools and, quantized, their scales
        self.bases = [(t.data_ptr(), t.stride(0) * t.element_size()) for t in parts] + [(None, 0)] * (4 - len(parts))
        rows = kernels.backend.rows(meta)
        self.attend = tuple(t.to(torch.int64).contiguous() for t in (rows.rows, rows.seqs, rows.lens))
        # per layer: its window (0: none) and the tree's pointers, the bits narrowed where the layer slides
        self.windows = [kernels.backend.window(i) for i in range(c.num_hidden_layers)]
        self.trees = {w: (rows.tree_first.data_ptr(), rows.bits(w).data_ptr()) if rows.tree_first is not None
                      else (None, None) for w in set(self.windows)}
        self.slots = meta.slot_mapping.to(torch.int64).contiguous()
        self.tables = meta.block_tables.to(torch.int64).contiguous()
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        need = m * (4 * self.hidden + kernels.qkv_width + kernels.attn_width + 3 * self.inter)
        if kernels.scratch is None or kernels.scratch.numel() < need:
            kernels.scratch = x.new_empty(need)
        buffer = kernels.scratch
        self.x_out = buffer[: m * self.hidden].view(m, self.hidden)
        self.residual_out = buffer[m * self.hidden: 2 * m * self.hidden].view(m, self.hidden)
        self.scratch = buffer[2 * m * self.hidden:]
        self.threads = torch.get_num_threads()

    def run(self, layer, x, residual):
        rows, seqs, lens = self.attend
        weights = self.weights[layer.layer_idx]
        k_pool, v_pool, k_scale, v_scale = (base and base + layer.layer_idx * size for base, size in self.bases)
        window = self.windows[layer.layer_idx]
        x, (qkv, o, gate_up, down) = x.contiguous(), weights.weights
        bad = _library().decoder_layer_f32(
            self.m, self.hidden, layer.n_heads, layer.n_kv, layer.d, self.inter, layer.eps,
            x.data_ptr(), residual.data_ptr() if residual is not None else None, self.residual_out.data_ptr(),
            self.x_out.data_ptr(), layer.input_norm.data_ptr(), qkv.data_ptr(), o.data_ptr(),
            layer.post_norm.data_ptr(), _address(layer.q_norm), _address(layer.k_norm), gate_up.data_ptr(),
            down.data_ptr(),
            ctypes.cast(weights.scales, ctypes.c_void_p), self.cos.data_ptr(), self.sin.data_ptr(),
            k_pool, v_pool, self.kv_kind, k_scale, v_scale, self.num_blocks, self.block_size,
            self.slots.data_ptr(),
            rows.data_ptr(), seqs.data_ptr(), lens.data_ptr(), rows.numel(), *self.trees[window], window or 0,
            self.tables.data_ptr(),
            self.tables.shape[1], self.scratch.data_ptr(), self.threads)
        if bad:
            raise RuntimeError(f"{bad} rows had a slot or block table outside the pool (an engine bug; "
                               "nothing was written or read out of bounds)")
        return self.x_out, self.residual_out


def _address(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None
