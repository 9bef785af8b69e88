"""The benchmark's rows are named from their own fields, so the README's figures find them by name
and a rerun names them alike."""
import json
from pathlib import Path

from course.s05_speculative.bench.benchmark import named

RESULTS = Path(__file__).resolve().parents[2] / "results" / "benchmark.json"


def test_benchmark_rows_are_named_by_their_fields_and_unique():
    row = {"workload": "chat", "method": "stage 02", "k": 0, "speedup": 1.0}
    assert list(named(row)) == ["name", *row] and named(row)["name"] == "chat/stage02/k=0"
    rows = json.loads(RESULTS.read_text())["rows"]
    assert [r["name"] for r in rows] == [named({k: v for k, v in r.items() if k != "name"})["name"] for r in rows]
    assert len({r["name"] for r in rows}) == len(rows)
