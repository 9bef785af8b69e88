"""The real-world coverage benchmark: `--quick` runs the 12 local schemas against
xgrammar and llguidance on a byte-level tokenizer; the report has its structure, and every
local schema compiles in best-effort mode (each relaxation reported)."""
import json

import pytest

from course.s08_structured.realworld import bench_coverage

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")

ROW_KEYS = {"schema", "size_bytes", "strict", "strict_detail", "best_effort", "best_effort_detail", "warnings",
            "compile_s", "positions", "xgrammar", "xgrammar_detail", "xgrammar_compile_s", "compile_ratio",
            "llguidance", "llguidance_detail", "llguidance_compile_s", "mask", "mask_ratio"}
STATUSES = {"ok", "refused (budget)", "unsupported", "error"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("coverage") / "coverage.json"
    assert bench_coverage.main(["--quick", "--json", str(out)])["rows"]
    return json.loads(out.read_text())


def test_quick_report_structure(report):
    rows = report["rows"]
    assert [r["schema"] for r in rows] == sorted("local/" + p.stem for p in bench_coverage.REALWORLD.glob("*.json"))
    assert len(rows) == 12
    for r in rows:
        assert ROW_KEYS <= set(r), r["schema"]
        assert r["strict"] in STATUSES and r["best_effort"] in STATUSES
        assert r["xgrammar"] in {"ok", "error"}
        assert (r["xgrammar_compile_s"] is None) == (r["xgrammar"] != "ok")
        assert r["llguidance"] in {"ok", "error"}
        assert (r["llguidance_compile_s"] is None) == (r["llguidance"] != "ok")
    s = report["summary"]
    assert s["schemas"] == 12
    assert s["ours_best_effort"] >= s["ours_strict"]
    assert s["both"] == sum(r["best_effort"] == "ok" and r["xgrammar"] == "ok" for r in rows)
    assert s["compile_ratio_n"] == sum(r["compile_ratio"] is not None for r in rows)
    assert s["median_compile_ratio"] > 0 and s["median_mask_ratio"] > 0
    common = [r for r in rows if r["compile_s"] and r["xgrammar_compile_s"] and r["llguidance_compile_s"]]
    assert s["all_three"] == len(common) > 0
    assert set(s["engines"]) == set(bench_coverage.MASKERS)
    for engine, e in s["engines"].items():   # medians and p99s over the same schemas for each engine
        if engine in bench_coverage.ENGINES:   # the lesson's walk masks our compiled grammar: no compile of its own
            assert 0 < e["compile_median_ms"] <= e["compile_p99_ms"], engine
        assert 0 < e["mask_median_ms"] <= e["mask_p99_ms"], engine
        assert e["mask_steps"] == sum(len(r["mask"]["times_ms"][engine]) for r in common)


def test_every_local_schema_compiles_best_effort(report):
    for r in report["rows"]:
        assert r["best_effort"] == "ok", (r["schema"], r["best_effort_detail"])
        assert r["compile_s"] > 0 and r["positions"] > 0
        # best-effort reports a warning for each relaxation: a schema strict mode refused has one
        if r["strict"] != "ok":
            assert r["warnings"] >= 1, r["schema"]
        mask = r["mask"]
        assert "error" not in mask, mask
        assert mask["path_tokens"] > 0 and mask["ours_ms"] > 0
        assert mask["ours_steps"] == mask["ours_lesson_steps"] == mask["path_tokens"]
        if r["xgrammar"] == "ok":
            assert mask["xgrammar_ms"] > 0 and r["mask_ratio"] > 0
        if r["llguidance"] == "ok":
            assert mask["llguidance_ms"] > 0 and mask["llguidance_steps"] >= 1


def test_quick_prints_tables(capsys):
    assert bench_coverage.main(["--quick", "--only", "get_weather"])["rows"]
    out = capsys.readouterr().out
    assert "| local/get_weather |" in out and "compiled by both" in out and "| llguidance |" in out
