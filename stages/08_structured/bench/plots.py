"""The notebook's figure of the benchmark (benchmark.py's result): one token's mask, naive vs
ours vs xgrammar, per grammar; and compile time against the automaton's size."""
from __future__ import annotations

import numpy as np

IMPLEMENTATIONS = (("naive", "tab:gray"), ("ours", "tab:blue"), ("xgrammar", "tab:orange"))


def plot_benchmark(result: dict):
    """A matplotlib Figure of `result` (benchmark.main's return value, or results/benchmark.json)."""
    import matplotlib.pyplot as plt

    rows, full = result["rows"], result["full_schema_compile"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    x, width = np.arange(len(rows)), 0.27
    for i, (who, colour) in enumerate(IMPLEMENTATIONS):
        left.bar(x + (i - 1) * width, [r[who]["median_ms"] for r in rows], width, label=who, color=colour)
    left.set_yscale("log")
    left.set_xticks(x, [r["grammar"] for r in rows], rotation=45, ha="right")
    left.set(ylabel="mask time per token, median (ms)", title="one token's mask")
    left.legend()
    right.scatter([r["positions"] for r in rows + full], [r["compile_s"] for r in rows + full],
                  label="ours", color="tab:blue")
    right.scatter([r["positions"] for r in rows], [r["xgrammar_compile_s"] for r in rows], label="xgrammar",
                  color="tab:orange", marker="x")
    right.set(xscale="log", yscale="log", title="compile time vs grammar size", ylabel="compile (s)",
              xlabel="automaton positions (ours; xgrammar's plotted at the same size)")
    right.legend()
    fig.tight_layout()
    return fig
