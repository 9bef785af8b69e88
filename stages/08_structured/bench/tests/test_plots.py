"""The notebook's benchmark figure draws the committed results: a bar per implementation and
grammar, a point per compile."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display

import matplotlib.pyplot as plt  # noqa: E402

from course.s08_structured.bench.plots import IMPLEMENTATIONS, plot_benchmark  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results" / "benchmark.json"


def test_plot_benchmark_draws_every_grammar_and_compile():
    result = json.loads(RESULTS.read_text())
    fig = plot_benchmark(result)
    left, right = fig.axes
    rows, full = result["rows"], result["full_schema_compile"]
    assert len(left.patches) == len(IMPLEMENTATIONS) * len(rows)
    assert [t.get_text() for t in left.get_xticklabels()] == [r["grammar"] for r in rows]
    heights = [p.get_height() for p in left.patches[len(rows):2 * len(rows)]]   # the second bar set: ours
    assert heights == [r["ours"]["median_ms"] for r in rows]
    ours, xgrammar = right.collections
    assert len(ours.get_offsets()) == len(rows) + len(full) and len(xgrammar.get_offsets()) == len(rows)
    plt.close(fig)
