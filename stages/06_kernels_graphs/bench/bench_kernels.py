"""Each kernel on its own: achieved bandwidth on a GPU, correctness under the interpreter on a CPU.

    python -m course.s06_kernels_graphs.bench.bench_kernels [--json out.json | --results]

On CUDA, for the decode kernel (single pass and split-K) at several batch sizes and context
lengths, and for the KV write and fused add+RMSNorm against their PyTorch versions:
achieved GB/s = the bytes the operation must move / its time, next to the device's measured
copy bandwidth (the roof). The prefill kernel is compute-bound: TFLOP/s against torch's
`scaled_dot_product_attention` on the same (gathered, contiguous) data.

Without CUDA, Triton runs only through its interpreter, whose timings mean nothing; the
script then runs each kernel against its PyTorch oracle on a few shapes and prints the error.
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.bench.measure import bench_cli

from ..decode_attention import paged_decode_attention
from ..fused_norm import fused_add_rms_norm
from ..kv_write import write_kv
from ..prefill_attention import varlen_paged_attention
from .testing import make_paged_case, reference_attention
from .roofline import copy_bandwidth, decode_pool, device_timed

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 64, 16  # Llama-3.2-1B's attention shape


def interpreter_check() -> list[dict]:
    rows = []
    for seq_lens, qlens, splits in [([5, 17, 33], [1, 1, 1], 1), ([5, 17, 33], [1, 1, 1], 3),
                                    ([9, 20], [9, 4], None), ([12, 3, 30], [1, 3, 7], None)]:
        case = make_paged_case(seq_lens, qlens, num_heads=6, num_kv_heads=2, head_dim=64, block_size=4)
        want = reference_attention(case)
        if splits:
            got = paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                         num_splits=splits)
            name = f"decode, {splits} split(s)"
        else:
            got = varlen_paged_attention(case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                                         case.block_tables, case.max_query_len)
            name = "varlen prefill+decode"
        err = (got.float() - want).abs().max().item()
        rows.append({"name": f"{name}/" + ",".join(map(str, qlens)), "kernel": name, "seq_lens": seq_lens,
                     "query_lens": qlens, "max_abs_err": err})
        print(f"{name:24s} seq_lens={seq_lens} query_lens={qlens}: max |err| = {err:.2e}")
    return rows


def gpu_rows(dtype=torch.bfloat16) -> list[dict]:
    dev = torch.device("cuda")
    roof = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {roof / 1e9:.0f} GB/s")
    rows = []

    def row(kind, shape, seconds, nbytes, torch_seconds=None):
        r = {"name": f"{kind}/{shape}", "kernel": kind, "shape": shape, "us": seconds * 1e6, "GBps": nbytes / seconds / 1e9,
             "pct_of_copy": 100 * nbytes / seconds / roof}
        if torch_seconds:
            r["speedup_vs_torch"] = torch_seconds / seconds
        rows.append(r)
        print(f"{kind:22s} {shape:22s} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s ({r['pct_of_copy']:4.1f}%)"
              + (f"  x{r['speedup_vs_torch']:.2f} vs torch" if torch_seconds else ""))

    for batch in (1, 8, 32, 64):
        for context in (512, 2048, 8192):
            q, k, v, tables, lens, out, nbytes = decode_pool(batch, context, HEADS, KV_HEADS, HEAD_DIM, BLOCK,
                                                            dtype, dev)
            nb = tables.shape[1]
            from ..decode_attention import choose_num_splits
            chosen = choose_num_splits(batch, KV_HEADS, nb, torch.cuda.get_device_properties(dev).multi_processor_count)
            for s in sorted({1, chosen}):  # unsplit, and the split the backend would choose
                t = device_timed(lambda: paged_decode_attention(q, k, v, tables, lens, num_splits=s, out=out), dev, reps=20)
                row(f"decode split={s}", f"B={batch} L={context}", t, nbytes)
    for rows_n in (64, 1024, 8192):
        hidden = 2048
        x, res = (torch.randn(rows_n, hidden, device=dev, dtype=dtype) for _ in range(2))
        w = torch.randn(hidden, device=dev, dtype=dtype)

        def torch_norm():
            s = x + res
            sf = s.float()
            return w * (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype), s
        row("add+rmsnorm", f"T={rows_n} H={hidden}", device_timed(lambda: fused_add_rms_norm(x, res, w, 1e-5), dev, reps=20),
            4 * x.nbytes, device_timed(torch_norm, dev, reps=20))
        kv = torch.randn(rows_n, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
        pool = torch.empty(rows_n // BLOCK + 1, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
        slots = torch.randperm(rows_n, device=dev)
        row("kv write", f"T={rows_n}", device_timed(lambda: write_kv(kv, kv, pool, pool, slots), dev, reps=20),
            4 * kv.nbytes, device_timed(lambda: pool.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, slots, kv), dev, reps=20) * 2)
    for prompts, length in ((1, 2048), (4, 1024), (16, 512)):
        case = make_paged_case([length] * prompts, [length] * prompts, num_heads=HEADS, num_kv_heads=KV_HEADS,
                               head_dim=HEAD_DIM, block_size=BLOCK, dtype=dtype, device=dev)
        args = [t.to(dev) for t in (case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                                    case.block_tables)]
        t = device_timed(lambda: varlen_paged_attention(*args, case.max_query_len), dev, reps=10)
        flops = 2 * 2 * HEADS * HEAD_DIM * prompts * length * length / 2  # QK and PV, causal half
        qd = case.q.to(dev).view(prompts, length, HEADS, HEAD_DIM).transpose(1, 2)
        kd = qd[:, :KV_HEADS].contiguous()
        t_sdpa = device_timed(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, kd, is_causal=True,
                                                                                 enable_gqa=True), dev, reps=10)
        rows.append({"name": f"varlen prefill/{prompts}x{length}", "kernel": "varlen prefill",
                     "shape": f"{prompts}x{length}", "us": t * 1e6,
                     "TFLOPs": flops / t / 1e12, "speedup_vs_sdpa": t_sdpa / t})
        print(f"varlen prefill {prompts}x{length}: {t * 1e6:9.1f} us {flops / t / 1e12:6.1f} TFLOP/s"
              f"  x{t_sdpa / t:.2f} vs torch sdpa")
    return rows


def add_args(p: argparse.ArgumentParser) -> None:
    pass


def run(args) -> dict:
    if torch.cuda.is_available():
        return {"kernels": "lesson", "rows": gpu_rows()}
    print("# no CUDA: the interpreter's correctness run (timings under the interpreter mean nothing)")
    return {"kernels": "lesson", "rows": interpreter_check()}


main = bench_cli(__doc__, add_args, run, lambda result: None, module="course.s06_kernels_graphs.bench.bench_kernels")


if __name__ == "__main__":
    main()
