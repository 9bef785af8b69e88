"""The attention kernels side by side: the lesson's (decode_attention.py, prefill_attention.py)
and the gpu/ room's, on the same data, at the shapes the stage's GPU goals name.

    python -m course.s06_kernels_graphs.bench.bench_attention [--dry-run] [--ceilings PATH] [--json out.json | --results]

All bf16, a pool of 16-token pages with shuffled block tables, Llama-3.2-1B's heads (32 query
heads, 8 KV heads), head dims 64 and 128:

  decode   64 sequences x 2,048 and x 8,192 tokens, and 1 x 8,192 (split, reduce included):
           the bytes it must move (K and V once, q, out, the table) / its time, read against the
           measured read bandwidth (ceilings.py; `--ceilings` prints the ratio here too). Data
           that a few L2 caches could hold is replicated and the copies cycled, so each call
           reads from memory as a real step does.
  prefill  1 x 2,048 and 4 x 1,024 prompts, and a 256-token chunk over a 4,096-token cached
           prefix: causal FLOPs / time, and torch's scaled_dot_product_attention (the
           FlashAttention-2 backend) on the same data, laid out contiguously for it.

Each output is checked first against a float32 reference on a slice (two sequences of a decode,
the last 64 queries of a prefill's first sequence), then timed as replays of a CUDA graph
(ceilings.graph_time). A kernel that fails, or a room module that is not there, leaves an
"error" in its row and the rest runs on. `--dry-run` runs everything at tiny shapes on the CPU
through the Triton interpreter: the plumbing of gpu_check.sh, with figures that mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import traceback

import torch
import torch.nn.functional as F

from course.s01_decode_loop.bench.measure import bench_cli

from .roofline import decode_pool
from .ceilings import graph_time

PAGE = 16
HEADS, KV_HEADS = 32, 8           # Llama-3.2-1B
HEAD_DIMS = (64, 128)
# goal label -> (batch, context): the labels are what the summary matches on
DECODE = {"64 x 2,048": (64, 2048), "64 x 8,192": (64, 8192), "1 x 8,192": (1, 8192)}
# goal label -> (prompts, new tokens each, cached prefix)
PREFILL = {"1 x 2,048": (1, 2048, 0), "4 x 1,024": (4, 1024, 0), "256 over 4,096": (1, 256, 4096)}
# the dry run: the same labels at shapes the interpreter gets through in seconds
DRY_HEADS, DRY_KV_HEADS = 8, 2
DRY_DECODE = {"64 x 2,048": (2, 40), "64 x 8,192": (2, 72), "1 x 8,192": (1, 72)}
DRY_PREFILL = {"1 x 2,048": (1, 32, 0), "4 x 1,024": (2, 16, 0), "256 over 4,096": (1, 16, 40)}
CHECK_ROWS = 64  # prefill queries checked against the float32 reference


# ---- the kernels, each behind one call signature ------------------------------------------

def decode_kernels(num_sms: int) -> dict:
    """name -> (fn(q, k, v, tables, lens, out, splits) -> out, splits(batch, kv_heads, width) -> int),
    or the ImportError that kept it out. The lesson's kernel runs exactly `splits`; the room's
    takes it as a bound and picks each sequence's own on the device."""
    from ..decode_attention import choose_num_splits, paged_decode_attention

    kernels = {"lesson": (lambda q, k, v, t, n, out, s: paged_decode_attention(q, k, v, t, n, num_splits=s, out=out),
                          lambda batch, kv_heads, width: choose_num_splits(batch, kv_heads, width, num_sms))}
    try:
        from ..gpu import decode_attention as room
        kernels["room"] = (lambda q, k, v, t, n, out, s: room.paged_decode_attention(q, k, v, t, n, max_splits=s, out=out),
                           lambda batch, kv_heads, width: room.choose_max_splits(batch, kv_heads, width, num_sms))
    except ImportError as e:
        kernels["room"] = e
    return kernels


def prefill_kernels() -> dict:
    """name -> fn(case, out) -> out, or the ImportError that kept it out."""
    from ..prefill_attention import varlen_paged_attention

    kernels = {"lesson": lambda c, out: varlen_paged_attention(c["q"], c["k_pool"], c["v_pool"], c["cu"], c["lens"],
                                                              c["tables"], c["new"], out=out)}
    try:
        from ..gpu.prefill_attention import varlen_attention
        kernels["room"] = lambda c, out: varlen_attention(c["q"], c["k_new"], c["v_new"], c["k_pool"], c["v_pool"],
                                                          c["cu"], c["lens"], c["tables"], out=out)
    except ImportError as e:
        kernels["room"] = e
    return kernels


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    """How far an output is from its float32 reference; `correct`: within what the dtype allows
    (bf16 inputs and outputs: a few 1e-3 of the norm; float32 far less). NaN is never correct."""
    tol = 1e-4 if got.dtype == torch.float32 else 3e-2
    got = got.float()
    rel = ((got - want).norm() / want.norm()).item()
    return {"max_err": (got - want).abs().max().item(), "rel_err": rel, "correct": bool(rel <= tol)}


def first_call(fn):
    """(fn's result, seconds it took): the check's call, whose time only the dry run keeps (its
    figures mean nothing anyway, and the interpreter is slow enough to want each call once)."""
    start = time.perf_counter()
    result = fn()
    if result.is_cuda:
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


# ---- decode ---------------------------------------------------------------------------------

def decode_reference(q, k_pool, v_pool, tables, lens, rows) -> torch.Tensor:
    """float32 attention of the sequences in `rows`, their pages gathered back into order."""
    heads, d = q.shape[1:]
    hkv = k_pool.shape[2]
    out = []
    for b in rows:
        n = int(lens[b])
        pages = tables[b, :-(-n // k_pool.shape[1])].long()
        k = k_pool[pages].flatten(0, 1)[:n].float()  # [n, Hkv, D]
        v = v_pool[pages].flatten(0, 1)[:n].float()
        qg = q[b].float().view(hkv, heads // hkv, d)
        p = (torch.einsum("kgd,nkd->kgn", qg, k) * d ** -0.5).softmax(-1)
        out.append(torch.einsum("kgn,nkd->kgd", p, v).reshape(heads, d))
    return torch.stack(out)


def decode_rows(shapes: dict, heads: int, kv_heads: int, dtype, device, reps: int, l2_bytes: int) -> list[dict]:
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    kernels = decode_kernels(num_sms)
    rows = []
    for label, (batch, context) in shapes.items():
        for d in HEAD_DIMS:
            q, k, v, tables, lens, out, nbytes = decode_pool(batch, context, heads, kv_heads, d, PAGE, dtype, device,
                                                            shuffle=True)
            # copies of the pool so that the bytes cycled through exceed the L2 cache three times over
            copies = max(1, min(8, math.ceil(3 * l2_bytes / nbytes)))
            pools = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in range(copies - 1)]
            check = sorted({0, batch - 1})
            want = decode_reference(q, k, v, tables, lens, check)
            for impl, kernel in kernels.items():
                row = {"kernel": "decode", "case": label, "impl": impl, "batch": batch, "context": context,
                       "head_dim": d, "heads": heads, "kv_heads": kv_heads, "bytes": nbytes, "copies": copies}
                rows.append(row)
                if isinstance(kernel, Exception):
                    row["error"] = f"not importable: {kernel}"
                    continue
                fn, splits_for = kernel
                try:
                    splits = splits_for(batch, kv_heads, tables.shape[1])
                    got, first = first_call(lambda: fn(q, k, v, tables, lens, torch.full_like(out, float("nan")), splits))
                    err = errors(got[check], want)
                    seconds = graph_time([lambda kp=kp, vp=vp: fn(q, kp, vp, tables, lens, out, splits) for kp, vp in pools],
                                         launches=max(10, copies), reps=reps) if reps else first
                    row |= {"splits": splits, **err, "us": seconds * 1e6, "GBps": nbytes / seconds / 1e9}
                except Exception as e:  # noqa: BLE001 - one kernel's failure must not stop the run
                    traceback.print_exc()
                    row["error"] = f"{type(e).__name__}: {e}"[:400]
            del q, k, v, pools
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---- prefill ----------------------------------------------------------------------------------

def prefill_case(prompts: int, new: int, prefix: int, heads: int, kv_heads: int, d: int, dtype, device) -> dict:
    """`prompts` sequences of prefix + new tokens in a paged pool; the new tokens' q, and their own
    K/V also as the fresh projections a step would hold; the same data contiguous for SDPA."""
    total = prefix + new
    pages = -(-total // PAGE)
    k_pool = torch.randn(prompts * pages + 1, PAGE, kv_heads, d, device=device, dtype=dtype)
    v_pool = torch.randn_like(k_pool)
    tables = torch.randperm(prompts * pages, device=device).view(prompts, pages).to(torch.int32)
    k_seq = k_pool[tables.long()].flatten(1, 2)[:, :total]  # [P, total, Hkv, D]
    v_seq = v_pool[tables.long()].flatten(1, 2)[:, :total]
    q = torch.randn(prompts * new, heads, d, device=device, dtype=dtype)
    as_int = dict(device=device, dtype=torch.int32)
    return {"q": q, "k_pool": k_pool, "v_pool": v_pool, "tables": tables, "new": new, "prefix": prefix,
            "k_new": k_seq[:, prefix:].reshape(-1, kv_heads, d).contiguous(),
            "v_new": v_seq[:, prefix:].reshape(-1, kv_heads, d).contiguous(),
            "cu": torch.arange(prompts + 1, **as_int) * new, "lens": torch.full((prompts,), total, **as_int),
            # SDPA's layout: [P, heads, tokens, D]
            "sdpa_q": q.view(prompts, new, heads, d).transpose(1, 2).contiguous(),
            "sdpa_k": k_seq.transpose(1, 2).contiguous(), "sdpa_v": v_seq.transpose(1, 2).contiguous()}


def prefill_reference(c: dict) -> torch.Tensor:
    """float32 attention of the first sequence's last CHECK_ROWS queries: [rows, heads, D]."""
    q, k, v = c["sdpa_q"][0].float(), c["sdpa_k"][0].float(), c["sdpa_v"][0].float()
    heads, new, d = q.shape
    rows = min(CHECK_ROWS, new)
    k = k.repeat_interleave(heads // k.shape[0], 0)
    v = v.repeat_interleave(heads // v.shape[0], 0)
    s = torch.einsum("hqd,hkd->hqk", q[:, new - rows:], k) * d ** -0.5
    total = k.shape[1]
    positions = torch.arange(total - rows, total, device=q.device)  # the checked queries' own
    hidden = torch.arange(total, device=q.device)[None, :] > positions[:, None]
    return torch.einsum("hqk,hkd->qhd", s.masked_fill(hidden, float("-inf")).softmax(-1), v)


def sdpa_call(c: dict):
    """torch's SDPA on the case, FlashAttention-2 where torch has it; returns (fn, what ran)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = c["sdpa_q"], c["sdpa_k"], c["sdpa_v"]
    # bottom-right causal: the chunk's queries sit after the prefix
    mask = dict(is_causal=True) if c["prefix"] == 0 else dict(attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
    want = prefill_reference(c)
    rows = want.shape[0]
    tries = [("flash, grouped KV heads", [SDPBackend.FLASH_ATTENTION], True),
             ("flash, KV heads repeated", [SDPBackend.FLASH_ATTENTION], False),
             ("torch's default choice", None, True)]
    for name, backends, gqa in tries:
        kk, vv = (k, v) if gqa else (k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                                     v.repeat_interleave(q.shape[1] // v.shape[1], 1))

        def fn(kk=kk, vv=vv, backends=backends, gqa=gqa):
            if backends is None:
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa, **mask)
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa, **mask)
        try:
            got = fn()[0, :, -rows:].transpose(0, 1).float()
        except RuntimeError:
            continue
        if errors(got, want)["correct"]:  # the right mask and grouping, or try the next
            return fn, name
    raise RuntimeError("no SDPA variant computed this case right")


def causal_flops(prompts: int, new: int, prefix: int, heads: int, d: int) -> int:
    """QK and PV, 2 FLOPs per multiply-add each: query at position p sees p + 1 keys."""
    keys_seen = sum(range(prefix + 1, prefix + new + 1))
    return 4 * heads * d * keys_seen * prompts


def prefill_rows(shapes: dict, heads: int, kv_heads: int, dtype, device, reps: int) -> list[dict]:
    kernels = prefill_kernels()
    rows = []
    for label, (prompts, new, prefix) in shapes.items():
        for d in HEAD_DIMS:
            c = prefill_case(prompts, new, prefix, heads, kv_heads, d, dtype, device)
            flops = causal_flops(prompts, new, prefix, heads, d)
            want = prefill_reference(c)
            checked = want.shape[0]
            base = {"kernel": "prefill", "case": label, "prompts": prompts, "new_tokens": new, "prefix": prefix,
                    "head_dim": d, "heads": heads, "kv_heads": kv_heads, "flops": flops}
            try:
                sdpa, variant = sdpa_call(c)
                sdpa_s = graph_time(sdpa, reps=reps) if reps else first_call(sdpa)[1]
                rows.append({**base, "impl": "sdpa", "variant": variant, "us": sdpa_s * 1e6,
                             "TFLOPs": flops / sdpa_s / 1e12})
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                sdpa_s = None
                rows.append({**base, "impl": "sdpa", "error": f"{type(e).__name__}: {e}"[:400]})
            out = torch.empty_like(c["q"])
            for impl, kernel in kernels.items():
                row = {**base, "impl": impl}
                rows.append(row)
                if isinstance(kernel, Exception):
                    row["error"] = f"not importable: {kernel}"
                    continue
                try:
                    got, first = first_call(lambda: kernel(c, torch.full_like(out, float("nan"))))
                    err = errors(got[new - checked:new], want)
                    seconds = graph_time(lambda: kernel(c, out), reps=reps) if reps else first
                    row |= {**err, "us": seconds * 1e6, "TFLOPs": flops / seconds / 1e12}
                    if sdpa_s:
                        row["vs_sdpa"] = sdpa_s / seconds
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    row["error"] = f"{type(e).__name__}: {e}"[:400]
            del c, out
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---- the command -------------------------------------------------------------------------------

def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU through the interpreter: the plumbing only, figures mean nothing")
    p.add_argument("--ceilings", metavar="PATH", help="ceilings.py's JSON: print each figure's ratio to its ceiling")
    p.add_argument("--parts", nargs="+", default=["decode", "prefill"], choices=["decode", "prefill"])


def run(args) -> dict:
    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16  # the interpreter's 16-bit arithmetic is not faithful
    heads, kv_heads = (DRY_HEADS, DRY_KV_HEADS) if dry else (HEADS, KV_HEADS)
    reps = 0 if dry else 5  # 0: each kernel runs once, its check (the dry run)
    l2 = 0 if dry else (getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 << 20)
    torch.manual_seed(0)
    rows = []
    if "decode" in args.parts:
        rows += decode_rows(DRY_DECODE if dry else DECODE, heads, kv_heads, dtype, device, reps, max(l2, 1))
    if "prefill" in args.parts:
        rows += prefill_rows(DRY_PREFILL if dry else PREFILL, heads, kv_heads, dtype, device, reps)
    # impl "lesson": the lesson's kernel set; "room": the gpu room's; "sdpa": torch's, for scale
    result = {"dry_run": dry, "dtype": str(dtype), "page": PAGE, "kernels": "lesson+gpu", "rows": rows}
    if args.ceilings:
        result["ceilings"] = json.loads(open(args.ceilings).read())
    return result


def report(result: dict) -> None:
    read = result.get("ceilings", {}).get("read_GBps")
    gemm = result.get("ceilings", {}).get("gemm_TFLOPs")
    if result["dry_run"]:
        print("# dry run on the CPU through the interpreter: the figures below mean nothing")
    for r in result["rows"]:
        what = f"{r['kernel']:7s} {r['case']:15s} D={r['head_dim']:<3d} {r['impl']:6s}"
        if "error" in r:
            print(f"{what} ERROR {r['error']}")
        elif r["kernel"] == "decode":
            share = f" {100 * r['GBps'] / read:5.1f}% of read" if read else ""
            print(f"{what} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s{share}  splits={r['splits']}"
                  f" err={r['rel_err']:.1e}{'' if r['correct'] else ' WRONG'}")
        else:
            share = f" {100 * r['TFLOPs'] / gemm:5.1f}% of GEMM" if gemm else ""
            extra = (f"  x{r['vs_sdpa']:.2f} vs SDPA" if "vs_sdpa" in r else "") + \
                (f"  err={r['rel_err']:.1e}{'' if r['correct'] else ' WRONG'}" if "rel_err" in r
                 else f"  ({r['variant']})" if "variant" in r else "")
            print(f"{what} {r['us']:9.1f} us {r['TFLOPs']:6.1f} TFLOP/s{share}{extra}")


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.bench.bench_attention")


if __name__ == "__main__":
    main()
