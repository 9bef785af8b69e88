"""A decoder layer in one C call (cpu_layer.c), and the lm_head's product.

On the CPU a decode step is 30 layers of four matrix products plus the small work between them.
The products are bounded by how fast the weights stream from memory (few rows) or by arithmetic
(many); the small work is bounded by Python: ~10 calls per layer (norms, RoPE, the KV write,
attention, SiLU, module calls and views), ~0.15 ms a layer, a fifth of a single stream's step
and a tenth of a saturated one. `LayerCalls` runs each layer as one ctypes call instead, with
everything between the products in C. The products of up to BLOCKED_ROWS rows are
cpu_layer.c's register-blocked kernel, which beats torch's `bmm` and MKL there (it streams
each weight once, and keeps both FMA units busy from 4 rows on); bigger float32 ones are the
`sgemm_` of torch's own MKL, whose address is handed to the C (bench_cpu_kernels.py prints
the ratios).

It applies where its C covers everything: the fused model with the cpu ops, the cpu attention
backend, float32 or int8 (int8_linear.py's) weights without biases, every step. Anything else
(bf16, biases) takes the per-op path, which is also the reference its tests use. With int8
weights the products read a quarter of the bytes; with AVX-512 VNNI they are integer products
on activation rows rounded to int16 (cpu_int8.c), else the int8 weights are widened to float32.

    python -m course.s06_kernels_graphs.bench_cpu_kernels   # the products against bmm and MKL
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import nn

from . import native
from .backends import CpuPagedBackend
from .int8_linear import Int8Linear
from .split_linear import SplitLinear

SOURCE = Path(__file__).with_name("cpu_layer.c")
FLAGS = native.BASE_FLAGS + ["-ffast-math"]  # what cpu_attention.c, included, needs
# Rows up to which cpu_layer.c's blocked kernel beats the sgemm of torch's own MKL on our 2-core
# CPU (bench_cpu_kernels.py: 1.7-1.9x at 4-8 rows, 1.4x at 16, 1.2x at 32 and 64, 0.98x at 128:
# a GEMM's cache blocking over k wins there). Past it the C layer calls that sgemm for float32
# weights (int8 ones, and float32 ones where torch has no sgemm_, stay in the blocked kernel).
BLOCKED_ROWS = 64


@native.cached_loader
def _library():
    lib = native.load(SOURCE, FLAGS)
    ptr, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.product_f32.argtypes = [ptr, ptr, ptr, i64, i64, i64, i32]
    lib.product_f32.restype = None
    lib.product_i8_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i32]
    lib.product_i8_f32.restype = None
    lib.decoder_layer_f32.argtypes = [i64] * 6 + [f32] + [ptr] * 13 + [ptr, ptr, i64, i64, ptr] + \
        [ptr, ptr, ptr, i64, ptr, i64, ptr, i32]
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
    """x [m, k] @ weight[n, k].T through cpu_layer.c (float32 x); weight float32,
    or int8 with one float32 scale per row."""
    x = x.contiguous()
    out = x.new_empty(x.shape[0], weight.shape[0])
    m, (n, k), threads = x.shape[0], weight.shape, torch.get_num_threads()
    if scale is None:
        _library().product_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, n, k, threads)
    else:
        _library().product_i8_f32(x.data_ptr(), weight.data_ptr(), scale.data_ptr(), out.data_ptr(), m, n, k, threads)
    return out


class LayerWeights:
    """A layer's four weights (QKV, o, gate-up, down) as cpu_layer.c takes them, gathered once:
    the tensors, and the scales' pointers in the array the C reads (NULL: float32 weights)."""

    def __init__(self, weights):
        self.weights = [w for w, _ in weights]
        self.scale_tensors = [s for _, s in weights]  # kept alive for the pointers below
        self.scales = (ctypes.c_void_p * 4)(*[s.data_ptr() if s is not None else None for s in self.scale_tensors])

    @classmethod
    def of(cls, layer) -> "LayerWeights | None":
        weights = [layer_weight(linear) for linear in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)]
        return cls(weights) if all(w is not None for w in weights) else None


class LayerCalls:
    """One forward's setup for the one-call layers: the step's metadata as pointers, and the
    buffers every layer reuses. `run(layer, weights, x, residual)` returns what FusedLayer.forward
    returns."""

    def __init__(self, model, x, cos, sin, attn, meta):
        m, c = x.shape[0], model.config
        self.m, self.hidden, self.inter = m, c.hidden_size, c.intermediate_size
        pools = attn.cache  # each layer's K/V pool by address: base + layer * stride (a select per layer costs ~4 us)
        self.k_base, self.v_base, self.block_size = pools.k.data_ptr(), pools.v.data_ptr(), pools.block_size
        self.layer_bytes, self.num_blocks = pools.k.stride(0) * pools.k.element_size(), pools.k.shape[1]
        assert pools.k.is_contiguous() and pools.v.is_contiguous()
        if meta.plan is None:  # a decode step without host lengths: one row per sequence
            rows = torch.arange(meta.seq_lens.shape[0])
            self.attend = (rows, rows, meta.seq_lens.to(torch.int64))
        else:
            self.attend = (meta.plan.native.rows, meta.plan.native.seqs, meta.plan.native.lens)
        self.attend = tuple(t.contiguous() for t in self.attend)
        self.slots = meta.slot_mapping.to(torch.int64).contiguous()
        self.tables = meta.block_tables.to(torch.int64).contiguous()
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        layer = model.layers[0]
        qkv_width = (layer.n_heads + 2 * layer.n_kv) * layer.d
        need = m * (4 * self.hidden + qkv_width + layer.n_heads * layer.d + 3 * self.inter)
        if model._c_scratch is None or model._c_scratch.numel() < need:  # kept: big steps would page-fault anew
            model._c_scratch = x.new_empty(need)
        buffer = model._c_scratch
        self.x_out = buffer[: m * self.hidden].view(m, self.hidden)
        self.residual_out = buffer[m * self.hidden: 2 * m * self.hidden].view(m, self.hidden)
        self.scratch = buffer[2 * m * self.hidden:]
        self.threads = torch.get_num_threads()

    @staticmethod
    def applies(attn, meta) -> bool:
        """The step's side of the conditions (the model's is FusedCausalLM._one_call)."""
        return isinstance(attn, CpuPagedBackend) and (meta.plan is None or meta.plan.native is not None)

    def run(self, layer, weights: LayerWeights, x, residual):
        rows, seqs, lens = self.attend
        pool_offset = layer.layer_idx * self.layer_bytes
        x, (qkv, o, gate_up, down) = x.contiguous(), weights.weights
        bad = _library().decoder_layer_f32(
            self.m, self.hidden, layer.n_heads, layer.n_kv, layer.d, self.inter, layer.eps,
            x.data_ptr(), residual.data_ptr() if residual is not None else None, self.residual_out.data_ptr(),
            self.x_out.data_ptr(), layer.input_norm.data_ptr(), qkv.data_ptr(), o.data_ptr(),
            layer.post_norm.data_ptr(), gate_up.data_ptr(), down.data_ptr(),
            ctypes.cast(weights.scales, ctypes.c_void_p), self.cos.data_ptr(), self.sin.data_ptr(),
            self.k_base + pool_offset, self.v_base + pool_offset, self.num_blocks, self.block_size,
            self.slots.data_ptr(),
            rows.data_ptr(), seqs.data_ptr(), lens.data_ptr(), rows.numel(), self.tables.data_ptr(),
            self.tables.shape[1], self.scratch.data_ptr(), self.threads)
        if bad:
            raise RuntimeError(f"{bad} rows had a slot or block table outside the pool (an engine bug; "
                               "nothing was written or read out of bounds)")
        return self.x_out, self.residual_out
