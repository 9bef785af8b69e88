"""RoPE and the KV write in one launch: the gpu kernel set's `rotary_write_kv`.

The lesson's Triton backend launches two small kernels per layer before attention: RoPE on q
and k in place (rotary.py), then the scatter of k and v into their pool slots (kv_write.py),
which reads k back. Here one program per token does both: the rotated k goes from registers to
its place in the qkv buffer and to its pool slot, v is copied beside it. One launch instead of
two per layer, and k is read once. In a decode step of a small model, made of launches, that is
one kernel fewer in every layer; the backend offers it to the fused model as `rotary_forward`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..rotary import _rotate_heads


@triton.jit
def _rotary_write_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                            stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
                            stride_vt, stride_vh, stride_vd, stride_ct, stride_cd, stride_st, stride_sd, stride_slot,
                            Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """rotary.py's _rotary_kernel and kv_write.py's _write_kv_kernel in one program per token."""
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + t * stride_ct + i * stride_cd, mask=i < HALF, other=0.).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + t * stride_st + i * stride_sd, mask=i < HALF, other=0.).to(tl.float32)[None, :]
    _rotate_heads(q_ptr + t * stride_qt, stride_qh, stride_qd, cos, sin, Q_HEADS, HALF, BLOCK_QH, BLOCK_HALF)
    # k in place too (attention may read this step's k from qkv), and its halves kept for the pool
    k1, k2 = _rotate_heads(k_ptr + t * stride_kt, stride_kh, stride_kd, cos, sin, K_HEADS, HALF, BLOCK_KH, BLOCK_HALF)
    slot = tl.load(slot_ptr + t * stride_slot).to(tl.int64)
    if slot >= 0:  # a padding row (slot < 0) is rotated but not stored
        h = tl.arange(0, BLOCK_KH)[:, None]
        c = i[None, :]
        ok = (h < K_HEADS) & (c < HALF)
        dst = slot * (K_HEADS * 2 * HALF) + h * (2 * HALF) + c  # the pool is contiguous: [slot, head, dim]
        tl.store(k_cache_ptr + dst, k1, mask=ok)
        tl.store(k_cache_ptr + dst + HALF, k2, mask=ok)
        v = v_ptr + t * stride_vt + h * stride_vh + c * stride_vd
        tl.store(v_cache_ptr + dst, tl.load(v, mask=ok), mask=ok)
        tl.store(v_cache_ptr + dst + HALF, tl.load(v + HALF * stride_vd, mask=ok), mask=ok)


def apply_rotary_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    """rotary.apply_rotary_(q, k, cos, sin), then kv_write.write_kv(k, v, k_cache, v_cache,
    slot_mapping), in one launch (grid T): q and k rotated in place, the rotated k and v
    stored at their slots (< 0: skipped). Same arguments and contracts as those two."""
    t, q_heads, dim = q.shape
    k_heads = k.shape[1]
    assert k.shape == v.shape == (t, k_heads, dim) and dim % 2 == 0 and slot_mapping.shape == (t,)
    assert cos.shape == (t, dim // 2) and sin.shape == cos.shape
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (k_heads, dim)
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    if t == 0:
        return
    _rotary_write_kv_kernel[(t,)](
        q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
        *q.stride(), *k.stride(), *v.stride(), *cos.stride(), *sin.stride(), slot_mapping.stride(0),
        Q_HEADS=q_heads, K_HEADS=k_heads, HALF=dim // 2, BLOCK_QH=triton.next_power_of_2(q_heads),
        BLOCK_KH=triton.next_power_of_2(k_heads), BLOCK_HALF=triton.next_power_of_2(dim // 2))


def compile_cases(capability: tuple[int, int] = (9, 0)) -> list[dict]:
    """The kernel at each model shape of compile_report.py, as the fused model launches it."""
    from .compile_report import SHAPES, _pow2, _qkv_row, launch_case

    cases = []
    for s in SHAPES:
        row, half = _qkv_row(s), s.head_dim // 2
        args = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64",
                "stride_qt": row, "stride_qh": s.head_dim, "stride_qd": 1, "stride_kt": row,
                "stride_kh": s.head_dim, "stride_kd": 1, "stride_vt": row, "stride_vh": s.head_dim, "stride_vd": 1,
                "stride_ct": half, "stride_cd": 1, "stride_st": half, "stride_sd": 1, "stride_slot": 1,
                "Q_HEADS": s.heads, "K_HEADS": s.kv_heads, "HALF": half, "BLOCK_QH": _pow2(s.heads),
                "BLOCK_KH": _pow2(s.kv_heads), "BLOCK_HALF": _pow2(half)}
        cases.append(launch_case(s.name, _rotary_write_kv_kernel, args))
    return cases
