"""The notebook's two figures, drawn from what it computed. Each is a pyplot figure: a notebook
shows it when the cell ends, a script saves it (fig.savefig) and closes it (plt.close(fig))."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

CHAINS = ("draft", "lookup", "eagle")


def distributions_figure(p: Sequence[float], q: Sequence[float], emitted: Sequence[float]) -> Figure:
    """Target p, draft q and how often speculative sampling emitted each token, side by side per
    token (tensors or lists)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.27
    for shift, values, label in ((-width, p, "target p"), (0, q, "draft q"), (width, emitted, "emitted")):
        ax.bar([i + shift for i in range(len(p))], [float(v) for v in values], width, label=label)
    ax.set_xlabel("token")
    ax.set_title("speculative sampling emits p")
    ax.legend()
    fig.tight_layout()
    return fig


def methods_figure(rows: list[dict], workloads=("chat", "rewrite", "json")) -> Figure:
    """The benchmark's rows: tokens per target forward (top) and speedup over stage 02 (bottom)
    against k, one column per workload; each method a line (the EAGLE tree's k is its depth)."""
    fig, axes = plt.subplots(2, len(workloads), figsize=(13, 6), sharex=True, squeeze=False)
    for col, workload in enumerate(workloads):
        for method in (*CHAINS, "eagle-tree"):
            rs = [r for r in rows if r["workload"] == workload and r["method"] == method]
            style = dict(marker="*", color="k", ms=10, label="eagle tree") if method == "eagle-tree" \
                else dict(marker="o", label=method)
            for row, field in enumerate(("mean_accepted_length", "speedup")):
                axes[row, col].plot([r["k"] for r in rs], [r[field] for r in rs], **style)
        axes[1, col].axhline(1.0, color="gray", lw=0.8)
        axes[0, col].set_title(workload)
        axes[1, col].set_xlabel("k (tree: depth)")
    axes[0, 0].set_ylabel("tokens per target forward")
    axes[1, 0].set_ylabel("speedup over stage 02")
    axes[0, 0].legend()
    fig.tight_layout()
    return fig
