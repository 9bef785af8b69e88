"""The stage's GPU goals, one table: what each asks, what was measured, how far from its ceiling.

    python -m course.s06_kernels_graphs.bench.gpu_summary OUTDIR --card h100 [--json out.json]

Reads what gpu_check.sh wrote into OUTDIR for one card (CARD_ceilings.json, CARD_decode.json and
CARD_prefill.json or one CARD_attention.json with both, CARD_mixed_step.json, CARD_tests.json) and prints, for every goal, its target, the lesson's
kernel and the gpu/ room's kernel side by side, the room's figure as a share of the ceiling
measured in the same run, and whether the goal is met:

  decode     % of the measured read bandwidth (the bytes a call must move / its time)
  1 x 8,192  microseconds, reduce included; "of ceiling" = the time reading those bytes at the
             read bandwidth would take / the time it took
  prefill    time of torch's SDPA (FlashAttention-2) on the same data / the kernel's time;
             "of ceiling" = its TFLOP/s / the measured bf16 GEMM's
  steps      the mixed (and verification) step's time / a 64-decode step's, and whether each
             replayed a graph
  tests      the GPU tests, and the sm_90 compile report's test (tensor-core ops, no spills)

A kernel goal is met only if the kernel's output also matched its float32 reference (within a
few 1e-3 of its norm in bf16); a wrong one is marked WRONG. A figure missing from the files (a part that timed out, a room kernel that failed) shows as
"no data" and fails its goal. In a dry run (gpu_check.sh --dry-run) the figures come from the
CPU and mean nothing: the table then proves only that every goal is measured and read back.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from course.s01_decode_loop.bench.measure import bench_cli

HEAD_DIMS = (64, 128)
READ_SHARE = 0.70    # decode: of the measured read bandwidth
SINGLE_US = 15.0     # one sequence x 8,192: microseconds, reduce included
PREFILL_VS_SDPA = 0.8
CHUNK_VS_SDPA = 0.6
MIXED_VS_DECODE = 1.3
REPLAY_DIFF = 0.1    # a replay's logits against the eager step's, relative (bf16 rounding: ~1e-2)


def load(outdir: Path, card: str, part: str) -> dict:
    path = outdir / f"{card}_{part}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def find(rows: list[dict], **match) -> dict:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), {})


def wrong(row: dict) -> str:
    """A fast kernel that computes the wrong thing meets no goal: its figure says so."""
    return "" if row.get("correct") else f" WRONG (rel err {row.get('rel_err', float('nan')):.1e})"


def goal(name, target, lesson="no data", room="no data", of_ceiling=None, passed=False, values=(None, None)) -> dict:
    """One row; `values`: the lesson's and the room's figure as a number in the target's unit
    (a fraction of the ceiling, microseconds, a ratio), for a README to quote."""
    return {"goal": name, "target": target, "lesson": lesson, "room": room, "of_ceiling": of_ceiling,
            "pass": bool(passed), "lesson_value": values[0], "room_value": values[1]}


def decode_goals(rows: list[dict], read_gbps: float | None) -> list[dict]:
    goals = []
    for case in ("64 x 2,048", "64 x 8,192"):
        for d in HEAD_DIMS:
            lesson, room = (find(rows, kernel="decode", case=case, head_dim=d, impl=i) for i in ("lesson", "room"))
            share = lambda r: r["GBps"] / read_gbps if "GBps" in r and read_gbps else None  # noqa: E731
            shown = lambda r: f"{100 * share(r):.1f}% ({r['us']:.0f} us){wrong(r)}" if share(r) is not None else "no data"  # noqa: E731
            goals.append(goal(f"decode {case}, D {d}", f">= {100 * READ_SHARE:.0f}% of read bw", shown(lesson),
                              shown(room), share(room), (share(room) or 0) >= READ_SHARE and room.get("correct"),
                              (share(lesson), share(room))))
    for d in HEAD_DIMS:
        lesson, room = (find(rows, kernel="decode", case="1 x 8,192", head_dim=d, impl=i) for i in ("lesson", "room"))
        shown = lambda r: f"{r['us']:.1f} us{wrong(r)}" if "us" in r else "no data"  # noqa: E731
        floor = room["bytes"] / (read_gbps * 1e9) * 1e6 if "us" in room and read_gbps else None
        goals.append(goal(f"decode 1 x 8,192, D {d}", f"<= {SINGLE_US:.0f} us", shown(lesson), shown(room),
                          floor / room["us"] if floor else None,
                          "us" in room and room["us"] <= SINGLE_US and room.get("correct"),
                          (lesson.get("us"), room.get("us"))))
    return goals


def prefill_goals(rows: list[dict], gemm_tflops: float | None) -> list[dict]:
    goals = []
    for case, need in (("1 x 2,048", PREFILL_VS_SDPA), ("4 x 1,024", PREFILL_VS_SDPA), ("256 over 4,096", CHUNK_VS_SDPA)):
        for d in HEAD_DIMS:
            lesson, room = (find(rows, kernel="prefill", case=case, head_dim=d, impl=i) for i in ("lesson", "room"))
            shown = lambda r: f"x{r['vs_sdpa']:.2f} ({r['TFLOPs']:.0f} TFLOP/s){wrong(r)}" if "vs_sdpa" in r else "no data"  # noqa: E731
            name = f"prefill {case}, D {d}" if "over" not in case else f"chunk {case} cached, D {d}"
            goals.append(goal(name, f">= {need}x SDPA", shown(lesson), shown(room),
                              room["TFLOPs"] / gemm_tflops if "TFLOPs" in room and gemm_tflops else None,
                              room.get("vs_sdpa", 0) >= need and room.get("correct"),
                              (lesson.get("vs_sdpa"), room.get("vs_sdpa"))))
    return goals


def step_goals(mixed: dict) -> list[dict]:
    """The lesson's column: the step run eagerly; the room's: through the runner's graphs. A
    replay whose logits stray from the eager step's (past REPLAY_DIFF of their norm) meets nothing."""
    graphed = mixed.get("graphed", {})
    runs = {(r["mode"], r["step"]): r for r in mixed.get("rows", []) if "step_ms" in r}
    ms = lambda mode, step: f"{runs[(mode, step)]['step_ms']:.2f}" if (mode, step) in runs else "?"  # noqa: E731
    eager = lambda step: f"{ms('eager', step)} ms eager" if ("eager", step) in runs else "no data"  # noqa: E731
    diff = lambda step: runs.get(("graphs", step), {}).get("logits_rel_diff_vs_eager")  # noqa: E731
    same = lambda step: diff(step) is None or diff(step) <= REPLAY_DIFF  # noqa: E731
    replay = lambda step: f", logits vs eager {diff(step):.0e}" if diff(step) is not None else ""  # noqa: E731
    yes = lambda step: "yes" if graphed.get(step) else "no"  # noqa: E731
    ratio, verify = mixed.get("mixed_vs_decode"), mixed.get("verify_vs_decode")
    return [
        goal("mixed step (4 x 64 prefill + 60 decodes) / 64 decodes", f"<= {MIXED_VS_DECODE}x, graphed",
             eager("mixed"), f"x{ratio:.2f} ({ms('graphs', 'mixed')} / {ms('graphs', 'decode')} ms),"
             f" graphed {yes('mixed')} / {yes('decode')}{replay('mixed')}" if ratio else "no data",
             None, ratio is not None and ratio <= MIXED_VS_DECODE and graphed.get("mixed") and graphed.get("decode")
             and same("mixed") and same("decode"), (None, ratio)),
        goal("verification step (64 x 4 tokens)", "graphed", eager("verify"),
             f"x{verify:.2f} of decode ({ms('graphs', 'verify')} ms), graphed {yes('verify')}{replay('verify')}"
             if verify else "no data", None, graphed.get("verify") and same("verify"), (None, verify)),
    ]


def suite_goals(tests: dict) -> list[dict]:
    shown = lambda rc: "no data" if rc is None else "passed" if rc == 0 else f"failed (exit {rc})"  # noqa: E731
    return [goal("GPU tests (-m gpu): kernels, graph replay", "pass", "-",
                 shown(tests.get("gpu_tests_rc")), None, tests.get("gpu_tests_rc") == 0),
            goal("sm_90 report test: tensor cores, no spills", "pass", "-",
                 shown(tests.get("compile_report_rc")), None, tests.get("compile_report_rc") == 0)]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("outdir", type=Path, help="the folder gpu_check.sh wrote into")
    p.add_argument("--card", default="dry", help="the files' prefix: the card's short name (h100, h200) or dry")


def run(args) -> dict:
    ceilings = load(args.outdir, args.card, "ceilings")
    mixed = load(args.outdir, args.card, "mixed_step")
    tests = load(args.outdir, args.card, "tests")
    attention = [load(args.outdir, args.card, part) for part in ("attention", "decode", "prefill")]
    rows = [row for part in attention for row in part.get("rows", [])]
    goals = (decode_goals(rows, ceilings.get("read_GBps")) + prefill_goals(rows, ceilings.get("gemm_TFLOPs"))
             + step_goals(mixed) + suite_goals(tests))
    dry = any(part.get("dry_run") for part in (ceilings, *attention, mixed))
    return {"card": args.card, "kernels": "lesson+gpu", "dry_run": dry, "goals": goals,
            "ceilings": {k: ceilings.get(k) for k in ("copy_GBps", "read_GBps", "gemm_TFLOPs")},
            "met": sum(g["pass"] for g in goals), "of": len(goals)}


def report(result: dict) -> None:
    c = result["ceilings"]
    fmt = lambda x, spec: format(x, spec) if x is not None else "no data"  # noqa: E731
    print(f"\n## Stage 06 GPU goals, {result['card']}: ceilings measured in this run: copy {fmt(c['copy_GBps'], '.0f')}"
          f" GB/s, read {fmt(c['read_GBps'], '.0f')} GB/s, bf16 GEMM {fmt(c['gemm_TFLOPs'], '.0f')} TFLOP/s")
    print("lesson: the stage's own kernels (steps: run eagerly); room: gpu/'s kernels (steps: replayed graphs)")
    if result["dry_run"]:
        print("# DRY RUN on the CPU: every goal was measured and read back; the figures mean nothing")
    header = ("goal", "target", "lesson", "room", "of ceiling", "pass")
    table = [(g["goal"], g["target"], g["lesson"], g["room"],
              f"{100 * g['of_ceiling']:.1f}%" if g["of_ceiling"] is not None else "-",
              "dry" if result["dry_run"] else "PASS" if g["pass"] else "fail") for g in result["goals"]]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *table]:
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
    print(f"{result['met']} of {result['of']} goals met" + (" (dry run: not a measurement)" if result["dry_run"] else ""))


main = bench_cli(__doc__, add_args, run, report, module="course.s06_kernels_graphs.bench.gpu_summary")


if __name__ == "__main__":
    main()
