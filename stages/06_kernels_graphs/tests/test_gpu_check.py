"""The device script's plumbing, proven on the CPU: gpu_check.sh's Python parts in their dry run
(tiny shapes, Triton's interpreter) write files that the summary reads back into a row for every
goal. The figures mean nothing here; what is tested is that nothing is left unmeasured."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from course.s06_kernels_graphs.bench import bench_attention, bench_moe, ceilings, gpu_summary, mixed_step

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_check.sh"

GOALS = [f"decode {case}, D {d}" for case in ("64 x 2,048", "64 x 8,192", "1 x 8,192") for d in (64, 128)] + \
        [f"prefill {case}, D {d}" for case in ("1 x 2,048", "4 x 1,024") for d in (64, 128)] + \
        [f"chunk 256 over 4,096 cached, D {d}" for d in (64, 128)] + \
        ["mixed step (4 x 64 prefill + 60 decodes) / 64 decodes", "verification step (64 x 4 tokens)",
         "GPU tests (-m gpu): kernels, graph replay", "sm_90 report test: tensor cores, no spills"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """Each Python part of gpu_check.sh --dry-run, as the script calls it; returns the folder."""
    out = tmp_path_factory.mktemp("gpu_check")
    ceilings.main(["--dry-run", "--json", str(out / "dry_ceilings.json")])
    for kind in ("decode", "prefill"):
        bench_attention.main(["--dry-run", "--parts", kind, "--ceilings", str(out / "dry_ceilings.json"),
                              "--json", str(out / f"dry_{kind}.json")])
    mixed_step.main(["--dry-run", "--json", str(out / "dry_mixed_step.json")])
    bench_moe.main(["--dry-run", "--batches", "1", "3", "--json", str(out / "dry_moe.json")])
    (out / "dry_tests.json").write_text(json.dumps({"dry_run": True, "gpu_tests_rc": 0, "compile_report_rc": 0}))
    return out


def test_the_summary_has_a_row_for_every_goal_and_prints_it_last(dry_run, capsys):
    capsys.readouterr()
    result = gpu_summary.main([str(dry_run), "--card", "dry", "--json", str(dry_run / "dry_summary.json")])
    printed = capsys.readouterr().out
    assert [g["goal"] for g in result["goals"]] == GOALS
    table = printed[printed.index("| goal"):]
    assert all(f"| {name}" in table for name in GOALS)
    assert result["dry_run"] and "DRY RUN" in printed
    assert len(list(dry_run.iterdir())) <= 8  # what a lent machine returns


def test_every_kernel_row_is_measured_and_checked(dry_run):
    rows = [row for kind in ("decode", "prefill") for row in json.loads((dry_run / f"dry_{kind}.json").read_text())["rows"]]
    lesson = [r for r in rows if r["impl"] == "lesson"]
    assert len(lesson) == 12 and all("error" not in r for r in lesson)
    assert all(r["correct"] and r["rel_err"] < 1e-4 and r["us"] > 0 for r in lesson)  # fp32, interpreted: exact
    assert all("us" in r or "error" in r for r in rows)  # a room kernel either measured or says why not
    assert {r["impl"] for r in rows} == {"lesson", "room", "sdpa"}


def test_the_steps_are_run_and_their_graphs_recorded(dry_run):
    result = json.loads((dry_run / "dry_mixed_step.json").read_text())
    steps = {r["step"]: r for r in result["rows"] if r["mode"] == "graphs"}
    assert set(steps) == {"decode", "mixed", "verify"}
    assert steps["decode"]["graphed"]  # decode buckets: always
    assert set(result["graphed"]) == {"decode", "mixed", "verify"}
    assert steps["mixed"]["tokens"] == 2 * 4 + 2 and steps["verify"]["tokens"] == 4 * 4


def test_the_moe_layer_is_timed_against_its_experts_bytes(dry_run):
    result = json.loads((dry_run / "dry_moe.json").read_text())
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    assert all(r["rel_err"] < 1e-4 and r["fused_us"] > 0 and r["loop_us"] > 0 and r["of_ceiling"] > 0
               for r in result["rows"])
    assert result["rows"][0]["distinct_experts"] == 2  # one token, top-2: two experts' bytes


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
