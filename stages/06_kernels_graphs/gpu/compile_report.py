"""What the compiler makes of every Triton kernel of stage 06, for a Hopper GPU, without one.

    python -m course.s06_kernels_graphs.gpu.compile_report [--arch 90] [--kernels decode,rms]
        [--results | --json PATH]       # --results: stages/06_kernels_graphs/results/compile_report.json

Triton compiles for any NVIDIA target on a machine with no GPU: `triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))` runs the whole pipeline (Triton IR -> TTGIR, the IR with
layouts, shared memory and the software pipeline -> PTX -> a cubin from the wheel's `ptxas`).
This report compiles each kernel at the shapes the stage launches it with (bf16, pages of 16
tokens; SmolLM2-135M, Llama-3.2-1B and a head-dim-128 model) and prints one row per
(kernel, case). How to read the columns, and why each matters on the GPU:

  warps, stages  The launch options: threads per program / 32, and how many loop iterations
                 Triton's pipeliner keeps in flight (their loads issued ahead of use).
  regs           Registers per thread (the cubin's, by `cuobjdump -res-usage`). An SM has 65,536
                 of them: a 4-warp program at 128 registers fills 16,384, so at most 4 such
                 programs (16 warps) fit on an SM. Fewer registers -> more warps resident ->
                 more loads in flight to hide memory latency (occupancy).
  spills         Bytes spilled to and reloaded from local memory per thread (`ptxas -v`), when a
                 kernel needs more than 255 registers or than the compiler chose to give it. Local
                 memory is DRAM behind the L1: every spill is memory traffic in the inner loop. Must be 0.
  smem           Shared memory one program needs, against the card's per-program limit (sm_90:
                 227 KB). Pipelining multiplies it (each stage holds its own K/V tiles): over the
                 limit the kernel does not launch; near it only one program fits per SM.
  warps/SM       Resident warps per SM (of 64 on sm_90) as registers and shared memory allow:
                 the occupancy a launch can reach, roughly as CUDA's occupancy calculator counts.
  async          Asynchronous global->shared copies: `cp.async` (Ampere's, per thread) and TMA
                 (Hopper's bulk tensor copies), counted in the PTX. They are the pipeliner at
                 work: the next tiles load while this one computes. "-" means every load waits.
  tensor cores   Matrix instructions: `wgmma` (Hopper's warpgroup MMA; `warp_group_dot` in
                 TTGIR) and `mma.sync` (the Ampere-style MMA), counted in the PTX. An attention
                 kernel without them does its products on the ordinary FP32 units, ~15x slower
                 on an H100 for bf16. tl.dot gets them for tiles of at least 16 on every side.

How to read it: compare rows of the same job. The lesson's decode kernel shows no tensor cores
and no async copies: its group of 1-8 query heads is below tl.dot's 16 rows, so it multiplies
and sums on the FP32 units and each tile's loads wait. The room's decode kernel pads the group
to 16 rows and shows wgmma and cp.async: tensor cores, and the pipeliner loading the next K/V
tiles while this one computes, paid for in shared memory (its smem column). The lesson's
prefill kernel has mma.sync but no wgmma: its 16-row tiles are sized for the interpreter, and a
Hopper warpgroup multiplies 64 rows at a time. No row may spill, and none may pass the shared
memory limit; a kernel near 255 registers, or at few warps per SM, is one to watch on the GPU.
What the report cannot show is time: that needs the GPU (gpu_check.sh).

Counts are static (instructions in the code, not executions). Pointers are taken as 16-byte
aligned and integers equal to 1 or divisible by 16 specialised, as Triton's launcher does for a
torch launch; a case lists the integers it knows divisible by 16 in "attrs" (names, or
Triton's own {(index,): [["tt.divisibility", 16]]}). The attention kernels' sliding `window`
is the exception: a runtime int the kernels mark `do_not_specialize`, so one compile serves
full layers (window 0) and sliding ones; every attention row here is that compile. Attention
sinks (gpt-oss) are the opposite: HAS_SINKS is a constexpr, so a kernel compiled without sinks
holds no sink code, and one with them is a compile of its own, listed at head dim 128 (", sinks").

Under the Triton interpreter (this stage switches it on when there is no CUDA) a `@triton.jit`
function cannot be compiled, so the compiling happens in one child process started with
TRITON_INTERPRET=0, which returns every row as JSON (compile_rows()).

The lesson's kernels are built here as case builders reading their wrappers' launch arguments;
the GPU room's kernels (gpu/decode_attention.py, gpu/prefill_attention.py) bring their own
`compile_cases(capability)`, built from the tile table their wrapper uses (the attention kernels,
`sink_compile_cases(capability)` too: their compile with sinks). A room module that is not there
is simply left out of the report.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from course.s01_decode_loop.bench.measure import bench_cli

MODULE = "course.s06_kernels_graphs.gpu.compile_report"
ROOM_MODULES = ("course.s06_kernels_graphs.gpu.decode_attention", "course.s06_kernels_graphs.gpu.prefill_attention",
                "course.s06_kernels_graphs.gpu.fused_moe", "course.s06_kernels_graphs.gpu.rotary_kv_write")


@dataclass(frozen=True)
class Card:
    """What a compute capability allows one SM (CUDA's occupancy table)."""
    shared_per_block: int  # bytes one program may opt in to
    shared_per_sm: int
    max_warps: int
    registers: int = 65536


CARDS = {80: Card(166912, 167936, 64), 86: Card(101376, 102400, 48), 89: Card(101376, 102400, 48),
         90: Card(232448, 233472, 64), 100: Card(232448, 233472, 64), 120: Card(101376, 102400, 48)}


@dataclass(frozen=True)
class ModelShape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int  # the MLP's inner width (gate and up each)


SHAPES = (ModelShape("SmolLM2-135M", 9, 3, 64, 576, 1536), ModelShape("Llama-3.2-1B", 32, 8, 64, 2048, 8192),
          ModelShape("head dim 128", 32, 8, 128, 4096, 14336))  # the last: Llama-3.1-8B's attention and hidden size
PAGE = 16  # tokens per pool block
TABLE_WIDTH = 128  # block-table columns in a graph: graph_max_seq_len 2,048 / 16
WINDOW = 4096  # a sliding layer's window (Mistral 7B's); the attention kernels compile the same for any
NUM_SMS = 132  # an H100 SXM's, for the lesson's choice of decode splits


# ---- the lesson's kernels, launched as their wrappers launch them -------------------------

def launch_case(name: str, kernel, args: dict, num_warps: int = 4, num_stages: int = 3) -> dict:
    """The case dict for `kernel[grid](**args)`: pointer arguments given as their type
    ("*bf16"), everything else as the value the wrapper passes. Specialised like Triton's
    launcher: an integer equal to 1 becomes a constant, one divisible by 16 is marked so,
    except a parameter the kernel marks do_not_specialize (a plain i32 whatever its value)."""
    signature, constexprs, divisible = {}, {}, []
    for p in kernel.params:
        value = args[p.name]
        if p.do_not_specialize and not p.is_constexpr:
            signature[p.name] = "i32"
        elif p.is_constexpr or (type(value) is int and value == 1):
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif isinstance(value, str):
            signature[p.name] = value
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                divisible.append(p.name)
    return {"name": name, "kernel": kernel, "signature": signature, "constexprs": constexprs,
            "num_warps": num_warps, "num_stages": num_stages, "attrs": divisible}


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _pool_strides(s: ModelShape) -> dict:
    """k/v pools [num_blocks, PAGE, Hkv, D], contiguous."""
    return {"stride_kb": PAGE * s.kv_heads * s.head_dim, "stride_ks": s.kv_heads * s.head_dim,
            "stride_kh": s.head_dim}


INT8_KV = ", int8 KV"  # the case of an int8 pool (stage 03's quantized_kv.py): codes and scale bytes


def _pools(int8: bool, head_dim: int) -> dict:
    """The pool pointers as the wrappers pass them: bf16 values (the scales' slots get the pools,
    unread), or int8 codes of rotated rows with scale bytes; the rotation's arguments either way."""
    from ..decode_attention import rotation
    if int8:
        return {"k_ptr": "*i8", "v_ptr": "*i8", "ks_ptr": "*u8", "vs_ptr": "*u8", **rotation(head_dim)}
    return {"k_ptr": "*bf16", "v_ptr": "*bf16", "ks_ptr": "*bf16", "vs_ptr": "*bf16", **rotation(head_dim)}


SINKS = ", sinks"  # the case with attention sinks (gpt-oss): one more logit per head, folded after the walk
SINKS_SHAPE = SHAPES[-1]  # sinks compiled at head dim 128 only: the widest accumulator, where registers run out first


def _sinks(sinks: bool) -> dict:
    """The sink arguments as the wrappers pass them: fp32 logits [H], or without sinks q's pointer
    (never read) and HAS_SINKS off, a constexpr: that compile holds no sink code."""
    return {"sinks_ptr": "*fp32" if sinks else "*bf16", "HAS_SINKS": sinks}


def _qkv_row(s: ModelShape) -> int:
    """q, k and v are strided views of the fused qkv projection's rows (fused_model.py)."""
    return (s.heads + 2 * s.kv_heads) * s.head_dim


def decode_cases(s: ModelShape) -> list[dict]:
    from ..decode_attention import BLOCK_N, _decode_kernel, choose_num_splits
    cases = []
    split = choose_num_splits(1, s.kv_heads, TABLE_WIDTH, NUM_SMS)
    with_sinks = [(split, False, True)] if s is SINKS_SHAPE else []
    for splits, int8, sinks in [(1, False, False), (split, False, False), (1, True, False)] + with_sinks:
        args = {"q_ptr": "*bf16", **_pools(int8, s.head_dim), "o_ptr": "*bf16",
                "part_o_ptr": "*fp32" if splits > 1 else "*bf16", "part_lse_ptr": "*fp32" if splits > 1 else "*bf16",
                "bt_ptr": "*i64", "seq_lens_ptr": "*i64", **_sinks(sinks),
                "scale": s.head_dim ** -0.5, "window": WINDOW,
                "stride_qb": _qkv_row(s), "stride_qh": s.head_dim, "stride_qd": 1,
                "stride_ob": s.heads * s.head_dim, "stride_oh": s.head_dim, "stride_od": 1, **_pool_strides(s),
                "stride_btb": TABLE_WIDTH, "stride_btw": 1, "cols_per_split": -(-TABLE_WIDTH // splits),
                "HEAD_DIM": s.head_dim, "BLOCK_D": _pow2(s.head_dim), "GROUP": s.heads // s.kv_heads,
                "BLOCK_G": _pow2(s.heads // s.kv_heads), "PAGE": PAGE, "NUM_SPLITS": splits, "BLOCK_N": BLOCK_N,
                "QUANTIZED": int8}
        name = f"{s.name}, splits {splits}{INT8_KV if int8 else ''}{SINKS if sinks else ''}"
        cases.append(launch_case(name, _decode_kernel, args))
    return cases


def reduce_cases(s: ModelShape) -> list[dict]:
    from ..decode_attention import _reduce_kernel, choose_num_splits
    splits = choose_num_splits(1, s.kv_heads, TABLE_WIDTH, NUM_SMS)
    args = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "o_ptr": "*bf16", "stride_ob": s.heads * s.head_dim,
            "stride_oh": s.head_dim, "stride_od": 1, "HEAD_DIM": s.head_dim, "BLOCK_D": _pow2(s.head_dim),
            "NUM_SPLITS": splits, "BLOCK_S": _pow2(splits)}
    return [launch_case(f"{s.name}, splits {splits}", _reduce_kernel, args)]


def prefill_cases(s: ModelShape) -> list[dict]:
    from ..prefill_attention import BLOCK_M, BLOCK_N, _varlen_paged_attn_kernel
    cases = []
    for int8, sinks in [(False, False), (True, False)] + ([(False, True)] if s is SINKS_SHAPE else []):
        args = {"q_ptr": "*bf16", **_pools(int8, s.head_dim), "o_ptr": "*bf16", "cu_ptr": "*i64",
                "seq_lens_ptr": "*i64", "bt_ptr": "*i64", **_sinks(sinks),
                "scale": s.head_dim ** -0.5, "window": WINDOW,
                "stride_qt": _qkv_row(s), "stride_qh": s.head_dim, "stride_qd": 1,
                "stride_ot": s.heads * s.head_dim, "stride_oh": s.head_dim, "stride_od": 1, **_pool_strides(s),
                "stride_bt": TABLE_WIDTH, "HEAD_DIM": s.head_dim, "BLOCK_D": max(16, _pow2(s.head_dim)), "PAGE": PAGE,
                "GROUP": s.heads // s.kv_heads, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "DOT_16BIT": True,
                "QUANTIZED": int8}
        cases.append(launch_case(s.name + (INT8_KV if int8 else "") + (SINKS if sinks else ""),
                                 _varlen_paged_attn_kernel, args))
    return cases


def kv_write_cases(s: ModelShape) -> list[dict]:
    from ..kv_write import _write_kv_kernel
    row = _qkv_row(s)
    args = {"k_ptr": "*bf16", "v_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64",
            "stride_kt": row, "stride_kh": s.head_dim, "stride_kd": 1, "stride_vt": row, "stride_vh": s.head_dim,
            "stride_vd": 1, "stride_st": 1, "HEADS": s.kv_heads, "HEAD_DIM": s.head_dim,
            "BLOCK_H": _pow2(s.kv_heads), "BLOCK_D": _pow2(s.head_dim)}
    cases = [launch_case(s.name, _write_kv_kernel, args)]
    from ..decode_attention import rotation
    from ..int8_kv.kv_write import _write_int8_kv_kernel  # the int8_kv room's: quantizing as it writes
    args = {**args, "k_cache_ptr": "*i8", "v_cache_ptr": "*i8", "ks_ptr": "*u8", "vs_ptr": "*u8",
            **rotation(s.head_dim)}
    return cases + [{**launch_case(s.name + INT8_KV, _write_int8_kv_kernel, args), "source": "int8_kv"}]


def norm_cases(s: ModelShape) -> list[dict]:
    from ..fused_norm import _rms_norm_kernel
    cases = []
    for add in (False, True):  # rms_norm (layer 0's input norm), fused_add_rms_norm (every other)
        stride_res = s.hidden if add else 0  # without a residual the wrapper passes x and stride 0
        args = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16",
                "stride_x": s.hidden, "stride_res": stride_res, "stride_out": s.hidden, "stride_res_out": stride_res,
                "eps": 1e-5, "N": s.hidden, "BLOCK": _pow2(s.hidden), "ADD_RESIDUAL": add}
        cases.append(launch_case(f"{s.name}{', + residual' if add else ''}", _rms_norm_kernel, args))
    return cases


def rotary_cases(s: ModelShape) -> list[dict]:
    from ..rotary import _rotary_kernel
    row, half = _qkv_row(s), s.head_dim // 2
    args = {"q_ptr": "*bf16", "k_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
            "stride_qt": row, "stride_qh": s.head_dim, "stride_qd": 1, "stride_kt": row, "stride_kh": s.head_dim,
            "stride_kd": 1, "stride_ct": half, "stride_cd": 1, "stride_st": half, "stride_sd": 1,
            "Q_HEADS": s.heads, "K_HEADS": s.kv_heads, "HALF": half, "BLOCK_QH": _pow2(s.heads),
            "BLOCK_KH": _pow2(s.kv_heads), "BLOCK_HALF": _pow2(half)}
    return [launch_case(s.name, _rotary_kernel, args)]


def silu_mul_cases(s: ModelShape) -> list[dict]:
    from ..silu_mul import _silu_mul_kernel
    args = {"gate_up_ptr": "*bf16", "out_ptr": "*bf16", "stride_in": 2 * s.intermediate,
            "stride_out": s.intermediate, "N": s.intermediate, "BLOCK": min(1024, _pow2(s.intermediate))}
    return [launch_case(s.name, _silu_mul_kernel, args)]


def lesson_cases() -> list[dict]:
    builders = (decode_cases, reduce_cases, prefill_cases, kv_write_cases, norm_cases, rotary_cases, silu_mul_cases)
    return [{"source": "lesson", **case} for build in builders for s in SHAPES for case in build(s)]


def room_cases(capability: tuple[int, int]) -> tuple[list[dict], dict[str, str]]:
    """The GPU room's cases, and for each room module left out, why."""
    cases, missing = [], {}
    for module in ROOM_MODULES:
        short = module.rsplit(".", 1)[1]
        try:
            room = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            missing[short] = f"{module} is not there"
            continue
        if not hasattr(room, "compile_cases"):
            missing[short] = f"{module} has no compile_cases()"
            continue
        builders = [room.compile_cases] + ([room.sink_compile_cases] if hasattr(room, "sink_compile_cases") else [])
        cases += [{**case, "source": f"gpu/{short}"} for build in builders for case in build(capability=capability)]
    return cases, missing


# ---- compiling one case and reading what came out -----------------------------------------

def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, flags=re.MULTILINE))


def read_ir(ttgir: str, ptx: str) -> dict:
    """Tensor-core and async-copy instructions in the kernel's TTGIR and PTX (static counts)."""
    return {
        "wgmma_ttgir": _count(r"ttng\.warp_group_dot\s", ttgir),
        "mma_ttgir": _count(r"tt\.dot\s.*#mma", ttgir),
        "wgmma_ptx": _count(r"^\s*wgmma\.mma_async", ptx),
        "mma_ptx": _count(r"^\s*mma\.sync", ptx),
        "cp_async_ttgir": _count(r"ttg\.async_copy_global_to_local\s", ttgir),
        "tma_ttgir": _count(r"ttng\.async_tma_copy_global_to_local\s", ttgir),
        "cp_async_ptx": _count(r"^\s*cp\.async\.c[ag]\.", ptx),
        "tma_ptx": _count(r"^\s*cp\.async\.bulk\.tensor", ptx),
    }


def _tool(name: str, arch: int) -> str | None:
    """The wheel's copy of an NVIDIA tool (triton/backends/nvidia/bin), or None; for ptxas,
    the one Triton itself runs for this arch."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas
    try:
        path = get_ptxas(arch).path if name == "ptxas" else getattr(knobs.nvidia, name).path
    except Exception:  # a wheel without the tool raises while looking it up
        return None
    return path if path and os.path.exists(path) else None


def registers_from_cubin(cuobjdump: str, cubin: bytes) -> dict:
    """REG (registers per thread) and LOCAL (bytes of local memory per thread) of the cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"(REG|LOCAL|STACK):(\d+)", out))
    return {"registers": int(usage["REG"]), "local_bytes": int(usage.get("LOCAL", 0))}


def spills_from_ptxas(ptxas: str, ptx: str, arch: str) -> dict:
    """Spill stores and loads per thread, from `ptxas -v` run as Triton runs it."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([ptxas, "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}", src, "-o", src + ".o"],
                             capture_output=True, text=True, check=True).stderr
    stores, loads = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
    registers = re.search(r"Used (\d+) registers", log).group(1)
    return {"spill_stores": int(stores), "spill_loads": int(loads), "ptxas_registers": int(registers)}


def occupancy_warps(registers: int | None, shared: int, num_warps: int, card: Card) -> int | None:
    """Resident warps per SM: registers are allocated per warp in units of 256, shared memory
    per program with 1 KB reserved by the system, at most 32 programs and max_warps warps."""
    if registers is None:
        return None
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = (card.registers // per_warp) // num_warps
    by_shared = card.shared_per_sm // (shared + 1024)
    programs = min(by_registers, by_shared, 32, card.max_warps // num_warps)
    return programs * num_warps


def row_name(source: str, kernel: str, case: str) -> str:
    """A row's name in the results file: its kernel set (lesson or gpu), the kernel, the case."""
    short = kernel.strip("_").removesuffix("_kernel")
    return f"{source.split('/')[0]}/{short}/{case.replace('[', ' (').replace(']', ')')}"


def compile_case(case: dict, arch: int, tools: dict) -> dict:
    """Compile one case for sm_<arch> and read its resources (needs TRITON_INTERPRET=0)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import sm_arch_from_capability
    from triton.compiler import ASTSource

    kernel, signature = case["kernel"], case["signature"]
    row = {"name": row_name(case.get("source", ""), kernel.__name__, case["name"]), "source": case.get("source", ""),
           "kernel": kernel.__name__, "case": case["name"], "num_warps": case["num_warps"],
           "num_stages": case["num_stages"]}
    # Pointers are 16-byte aligned (torch allocates so); the case names the integers that are too.
    divisible = [["tt.divisibility", 16]]
    named = case.get("attrs") or {}
    if not isinstance(named, dict):  # names rather than Triton's own {(index,): [[attr, value]]}
        named = {(kernel.arg_names.index(n),): divisible for n in named}
    pointers = {(kernel.arg_names.index(n),): divisible for n, t in signature.items() if t.startswith("*")}
    attrs = {**pointers, **named}
    try:
        src = ASTSource(fn=kernel, signature=signature, constexprs=case["constexprs"], attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": case["num_warps"], "num_stages": case["num_stages"]})
    except Exception as e:  # the report shows it; the test fails on it
        first_line = next(iter(str(e).strip().splitlines()), "")
        return {**row, "error": f"{type(e).__name__}: {first_line}"}
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    row["shared_bytes"] = compiled.metadata.shared
    row.update(read_ir(ttgir, ptx))
    row.update(registers=None, local_bytes=None, spill_stores=None, spill_loads=None)
    if tools["cuobjdump"]:
        row.update(registers_from_cubin(tools["cuobjdump"], compiled.asm["cubin"]))
    if tools["ptxas"]:
        found = spills_from_ptxas(tools["ptxas"], ptx, sm_arch_from_capability(arch))
        row.update(spill_stores=found["spill_stores"], spill_loads=found["spill_loads"])
        if row["registers"] is None:
            row["registers"] = found["ptxas_registers"]
    row["warps_per_sm"] = occupancy_warps(row["registers"], row["shared_bytes"], row["num_warps"], CARDS[arch])
    return row


def _child_main(request_path: str, result_path: str) -> None:
    """Runs in the child (TRITON_INTERPRET=0): build every case, compile the selected ones."""
    with open(request_path) as f:
        request = json.load(f)
    arch, kernels = request["arch"], request["kernels"]
    capability = (arch // 10, arch % 10)
    cases = lesson_cases()
    extra, missing = room_cases(capability)
    cases += extra
    if kernels:
        cases = [c for c in cases if any(k in f"{c['source']}/{c['kernel'].__name__}" for k in kernels)]
    tools = {"ptxas": _tool("ptxas", arch), "cuobjdump": _tool("cuobjdump", arch)}
    rows = [compile_case(case, arch, tools) for case in cases]
    import triton
    modules = sorted({case["kernel"].fn.__module__ for case in cases})
    with open(result_path, "w") as f:
        site = os.path.dirname(os.path.dirname(triton.__file__))  # tools named from the wheel's root
        json.dump({"target": f"cuda:{arch}", "triton": triton.__version__, "kernels": "lesson+gpu",
                   "tools": {tool: path and os.path.relpath(path, site) for tool, path in tools.items()},
                   "sources": {m: _file_digest(sys.modules[m].__file__) for m in modules},
                   "rooms_missing": missing, "rows": rows}, f)


def _file_digest(path: str) -> str:
    """A short hash of a kernel's source file: which version of the code a stored report describes."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()[:16]


def compile_rows(arch: int = 90, kernels: list[str] | None = None) -> dict:
    """Every case compiled for sm_<arch> in a child process with the interpreter off.
    kernels: substrings of "source/kernel name" to keep (e.g. "lesson/_decode", "rms"); None = all.
    Returns {"target", "triton", "tools", "sources" (a hash of each kernel file), "rooms_missing",
    "rows": [one dict per case], "limits"}."""
    if arch not in CARDS:
        raise ValueError(f"no occupancy table for sm_{arch}; known: {sorted(CARDS)}")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default (FMA contraction), said out loud
    with tempfile.TemporaryDirectory() as d:
        request, result = os.path.join(d, "request.json"), os.path.join(d, "result.json")
        with open(request, "w") as f:
            json.dump({"arch": arch, "kernels": kernels}, f)
        code = f"from {MODULE} import _child_main; _child_main({request!r}, {result!r})"
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the compiling process failed:\n{done.stderr[-4000:]}")
        with open(result) as f:
            report = json.load(f)
    card = CARDS[arch]
    report["limits"] = {"shared_per_block": card.shared_per_block, "max_warps_per_sm": card.max_warps,
                        "registers_per_sm": card.registers, "registers_per_thread": 255}
    return report


# ---- the command line ---------------------------------------------------------------------

def _fmt(n, none="?") -> str:
    return none if n is None else str(n)


def _counts(r: dict, labels: dict[str, str]) -> str:
    """The row's nonzero counts, e.g. "wgmma 16 mma 2"; "-" when all are zero."""
    return " ".join(f"{label} {r[key]}" for key, label in labels.items() if r[key]) or "-"


def _tensor_cores(r: dict) -> str:
    return _counts(r, {"wgmma_ptx": "wgmma", "mma_ptx": "mma"})


def _async(r: dict) -> str:
    return _counts(r, {"cp_async_ptx": "cp.async", "tma_ptx": "tma"})


def report(result: dict) -> None:
    limit = result["limits"]["shared_per_block"]
    print(f"target {result['target']}, Triton {result['triton']}, bf16, pages of {PAGE}; "
          f"shared memory limit {limit / 1024:.0f} KB per program, {result['limits']['max_warps_per_sm']} warps per SM")
    for tool, path in result["tools"].items():
        if path is None:
            print(f"  {tool} not found in the triton wheel: its columns show '?'")
    for room, why in result["rooms_missing"].items():
        print(f"  gpu/{room}: left out ({why})")
    names = [f"{r['source']}/{r['kernel']}" for r in result["rows"]]
    kw, width = max([6] + [len(n) for n in names]), max([4] + [len(r["case"]) for r in result["rows"]])
    header = (f"{'kernel':{kw}} {'case':{width}} {'warps':>5} {'stages':>6} {'regs':>4} {'spills st/ld':>12} "
              f"{'smem KB':>8} {'warps/SM':>8}  {'async':14} tensor cores")
    print(header)
    print("-" * len(header))
    for name, r in zip(names, result["rows"]):
        if "error" in r:
            print(f"{name:{kw}} {r['case']:{width}} FAILED: {r['error']}")
            continue
        spills = f"{_fmt(r['spill_stores'])}/{_fmt(r['spill_loads'])}"
        print(f"{name:{kw}} {r['case']:{width}} {r['num_warps']:>5} {r['num_stages']:>6} {_fmt(r['registers']):>4} "
              f"{spills:>12} {r['shared_bytes'] / 1024:>8.1f} {_fmt(r['warps_per_sm']):>8}  {_async(r):14} "
              f"{_tensor_cores(r)}")


def add_args(p) -> None:
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = H100/H200)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated substrings of 'source/kernel' to keep, e.g. lesson/_decode,rms")


def run(args) -> dict:
    kernels = [k for k in args.kernels.split(",") if k] if args.kernels else None
    return compile_rows(args.arch, kernels)


main = bench_cli(__doc__, add_args, run, report, module=MODULE)

if __name__ == "__main__":
    main()
