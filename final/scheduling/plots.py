"""The scheduling benchmark's runs, drawn and tabulated (the notebook's and `bench --plot`'s).

    plot_runs(runs)    per cost model: JCT CDFs at the highest load, mean / p99 JCT against load
    runs_table(runs)   one line per run: cost model, load, policy, JCT mean / p99, TTFT p99, stuck
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def plot_runs(runs: list[dict]):
    """Two panels per cost model. Returns the figure."""
    models = list(dict.fromkeys(r["cost_model"] for r in runs))
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 4 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        mine = [r for r in runs if r["cost_model"] == model]
        top = max(r["load"] for r in mine)
        for r in mine:
            if r["load"] == top:
                q = r["jct_quantiles_s"]
                row[0].plot(q, [i / (len(q) - 1) for i in range(len(q))], label=r["policy"])
        row[0].set(xscale="log", xlabel="JCT (s)", ylabel="fraction of requests",
                   title=f"{model}: JCT CDF at load {top}")
        for policy in dict.fromkeys(r["policy"] for r in mine):
            pts = sorted((r["load"], r["summary"]) for r in mine if r["policy"] == policy)
            line, = row[1].plot([p[0] for p in pts], [p[1]["jct_mean_s"] for p in pts], "o-", label=f"{policy} mean")
            row[1].plot([p[0] for p in pts], [p[1]["jct_p99_s"] for p in pts], "x--", color=line.get_color(),
                        label=f"{policy} p99")
        row[1].set(yscale="log", xlabel="load (arrival rate / FCFS capacity)", ylabel="JCT (s)",
                   title=f"{model}: JCT against load")
        for ax in row:
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def runs_table(runs: list[dict]) -> str:
    lines = [f"{'cost model':20s} {'load':>4s} {'policy':8s} {'JCT mean':>9s} {'JCT p99':>9s} {'TTFT p99':>9s} "
             f"{'stuck':>6s}"]
    for run in runs:
        s = run["summary"]
        lines.append(f"{run['cost_model']:20s} {run['load']:4.1f} {run['policy']:8s} {s['jct_mean_s']:9.1f} "
                     f"{s['jct_p99_s']:9.1f} {s['ttft_p99_s']:9.2f} {s['short_stuck_frac']:6.1%}")
    return "\n".join(lines)
