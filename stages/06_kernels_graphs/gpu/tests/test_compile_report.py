"""The stage's kernels compiled for sm_90 on the CPU: what must hold before a GPU runs them.

Every case is compiled once (one child process, ~20-40 s on two cores) and the rows shared by
the tests below. A GPU-room module that is not there skips only its own assertions.
"""
import json
import os
import subprocess
import sys

import pytest

from course.s06_kernels_graphs.gpu.compile_report import (CARDS, ROOM_MODULES, SHAPES, compile_rows, main,
                                                          occupancy_warps)

LESSON_KERNELS = {"_decode_kernel", "_reduce_kernel", "_varlen_paged_attn_kernel", "_write_kv_kernel",
                  "_rms_norm_kernel", "_rotary_kernel", "_silu_mul_kernel"}


@pytest.fixture(scope="module")
def report():
    return compile_rows(arch=90)


def rows_of(report, source, kernel=None):
    return [r for r in report["rows"] if r["source"] == source and (kernel is None or r["kernel"] == kernel)]


def room_rows(report, module):
    short = module.rsplit(".", 1)[1]
    if short in report["rooms_missing"]:
        pytest.skip(f"gpu/{short}: {report['rooms_missing'][short]}")
    rows = rows_of(report, f"gpu/{short}")
    assert rows, f"gpu/{short}.compile_cases() returned no cases"
    return rows


def test_every_case_compiles(report):
    failed = [f"{r['source']}/{r['kernel']} {r['case']}: {r['error']}" for r in report["rows"] if "error" in r]
    assert not failed, "\n".join(failed)


def test_every_lesson_kernel_at_every_model_shape(report):
    for kernel in LESSON_KERNELS:
        cases = " | ".join(r["case"] for r in rows_of(report, "lesson", kernel))
        for shape in SHAPES:
            assert shape.name in cases, f"{kernel} has no case at {shape.name}"


def test_no_register_spills(report):
    if report["tools"]["ptxas"] is None:
        pytest.skip("the triton wheel has no ptxas: spills cannot be read")
    spilled = [f"{r['source']}/{r['kernel']} {r['case']}: {r['spill_stores']} B stored, {r['spill_loads']} B loaded"
               for r in report["rows"] if "error" not in r and (r["spill_stores"] or r["spill_loads"])]
    assert not spilled, "\n".join(spilled)


def test_shared_memory_under_the_cards_limit(report):
    limit = report["limits"]["shared_per_block"]  # sm_90: 227 KB a program may opt in to
    over = [f"{r['source']}/{r['kernel']} {r['case']}: {r['shared_bytes']} B" for r in report["rows"]
            if "error" not in r and r["shared_bytes"] > limit]
    assert not over, "\n".join(over)


def test_lesson_decode_runs_without_tensor_cores(report):
    """The lesson's decode kernel is a broadcast product and a sum on the FP32 units: the
    GQA group (1..8 heads) is below tl.dot's 16 rows. The GPU room's kernel replaces it."""
    rows = rows_of(report, "lesson", "_decode_kernel")
    assert rows and all(r["wgmma_ttgir"] + r["mma_ttgir"] + r["wgmma_ptx"] + r["mma_ptx"] == 0 for r in rows)


def test_lesson_prefill_uses_tensor_cores(report):
    """Its tl.dot on 16-bit tiles becomes mma.sync; at 16 query rows the tile is too small
    for Hopper's warpgroup MMA (64 rows), so no wgmma."""
    rows = rows_of(report, "lesson", "_varlen_paged_attn_kernel")
    assert rows and all(r["mma_ttgir"] > 0 and r["mma_ptx"] > 0 for r in rows)
    assert all(r["wgmma_ttgir"] == 0 for r in rows)


@pytest.mark.parametrize("module", [m for m in ROOM_MODULES if m.endswith("attention")],
                         ids=lambda m: m.rsplit(".", 1)[1])
def test_gpu_room_attention_on_warpgroup_tensor_cores(report, module):
    """Both attention products of the room's kernels are Hopper wgmma (warp_group_dot in TTGIR),
    and their K/V tiles are loaded ahead by the pipeliner (async copies). A split-KV merge
    kernel has no product and no loop to pipeline, and is left out."""
    rows = [r for r in room_rows(report, module) if "reduce" not in r["kernel"] and "merge" not in r["kernel"]]
    assert rows
    no_wgmma = [f"{r['kernel']} {r['case']}" for r in rows if r["wgmma_ttgir"] < 2]
    assert not no_wgmma, f"fewer than two warp_group_dot ops: {no_wgmma}"
    not_pipelined = [f"{r['kernel']} {r['case']}" for r in rows if r["cp_async_ttgir"] + r["tma_ttgir"] == 0]
    assert not not_pipelined, f"no async copies (num_stages {rows[0]['num_stages']}): {not_pipelined}"


def test_fused_moe_on_tensor_cores_and_pipelined(report):
    """Both grouped GEMMs at Qwen3-30B-A3B's shape: mma.sync at decode's 16-row blocks, Hopper's
    wgmma at 64 rows, the weight tiles loaded ahead (async copies)."""
    rows = room_rows(report, "course.s06_kernels_graphs.gpu.fused_moe")
    assert len(rows) == 4 and all(r["cp_async_ptx"] + r["tma_ptx"] > 0 for r in rows)
    assert all((r["wgmma_ptx"] if "block_m=64" in r["case"] else r["mma_ptx"]) > 0 for r in rows)


def test_occupancy_from_registers_and_shared_memory():
    h100 = CARDS[90]
    assert occupancy_warps(128, 0, 4, h100) == 16  # 128 x 32 x 4 = 16,384 of 65,536 registers: 4 programs
    assert occupancy_warps(32, 0, 4, h100) == 64  # registers to spare: the 64-warp cap
    assert occupancy_warps(32, 100 * 1024, 4, h100) == 8  # 2 programs' tiles fill the 228 KB
    assert occupancy_warps(255, 0, 8, h100) == 8  # one 8-warp program at the register ceiling


def test_cli_prints_a_row_per_case(capsys, tmp_path):
    out_json = tmp_path / "report.json"
    result = main(["--kernels", "lesson/_write_kv", "--json", str(out_json)])
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("lesson/_write_kv_kernel")]
    assert len(rows) == len(SHAPES) == len(result["rows"])
    assert all(shape.name in printed for shape in SHAPES)
    stored = json.loads(out_json.read_text())
    assert "command" in stored and "machine" in stored  # stamped by the harness's write_json
    assert [r["case"] for r in stored["rows"]] == [r["case"] for r in result["rows"]]


_WINDOW_ARGS = """
from course.s06_kernels_graphs.gpu.compile_report import lesson_cases, room_cases
for case in lesson_cases() + room_cases((9, 0))[0]:
    kernel, attrs = case["kernel"], case["attrs"]
    params = {p.name: p for p in kernel.params}
    if "window" in params:
        named = [kernel.arg_names[i] for (i,) in attrs] if isinstance(attrs, dict) else list(attrs)
        print(kernel.__name__, case["signature"]["window"], params["window"].do_not_specialize, "window" in named)
"""


def test_attention_kernels_compile_the_window_as_one_runtime_int():
    """Every attention kernel (and the room's split merge) takes a sliding layer's window as an
    i32 that the launcher never specializes, not to a constant 1 nor as a multiple of 16: the
    rows above are then the very kernels that run for full layers (window 0) and sliding ones,
    and a model with both compiles each kernel once. Built where Triton compiles (no interpreter)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", _WINDOW_ARGS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.strip().splitlines()]
    kernels = {r[0] for r in rows}
    assert {"_decode_kernel", "_varlen_paged_attn_kernel"} <= kernels
    assert "_reduce_kernel" not in kernels  # the lesson's merge needs no window: an empty split's lse is -inf
    bad = [" ".join(r) for r in rows if r[1:] != ["i32", "True", "False"]]
    assert not bad, bad


def test_every_attention_kernel_compiles_with_sinks(report):
    """Attention sinks are a constexpr (HAS_SINKS), so a kernel with them is a compile of its own:
    each attention kernel has one at head dim 128 (where registers run out first), and it compiles
    without spills like the rest."""
    rows = [r for r in report["rows"] if r["case"].rstrip("]").endswith("sinks")]
    room = {"decode_attention": "_grouped_decode_kernel", "prefill_attention": "_varlen_attention_kernel"}
    want = {"_decode_kernel", "_varlen_paged_attn_kernel"}
    assert {r["kernel"] for r in rows} == want | {k for m, k in room.items() if m not in report["rooms_missing"]}
    assert all("error" not in r and "128" in r["case"] and not (r["spill_stores"] or r["spill_loads"]) for r in rows)
