"""What a schedule did to its requests: job completion time (JCT), TTFT, and head-of-line
blocking, summarised for the scheduling benchmark, and its plot."""
from __future__ import annotations

import statistics

from course.s01_decode_loop.bench.measure import percentile

from .cost_model import CostModel
from .simulator import Completion


def alone_s(cost: CostModel, prompt_tokens: int, output_tokens: int) -> float:
    """The request's JCT with the engine to itself: its prefill, then one decode step per token."""
    return cost.step_time(prompt_tokens, 1, prompt_tokens) + sum(
        cost.step_time(1, 1, prompt_tokens + k) for k in range(1, output_tokens))


def summarize(completions: list[Completion], cost: CostModel, short_output_tokens: int) -> dict:
    """Mean / p50 / p99 JCT and TTFT, and the share of short requests (answers of at most
    `short_output_tokens`) *stuck behind long ones*: still waiting for their first token when,
    alone, they would have been done."""
    jct = [c.jct_s for c in completions]
    ttft = [c.ttft_s for c in completions]
    short = [c for c in completions if c.output_tokens <= short_output_tokens]
    stuck = [c for c in short if c.ttft_s > alone_s(cost, c.prompt_tokens, c.output_tokens)]
    longest = sorted(completions, key=lambda c: c.output_tokens)[-max(1, len(completions) // 10):]
    return {"requests": len(completions), "jct_mean_s": statistics.fmean(jct), "jct_p50_s": percentile(jct, 50),
            "jct_p99_s": percentile(jct, 99), "ttft_mean_s": statistics.fmean(ttft),
            "ttft_p99_s": percentile(ttft, 99), "short_stuck_frac": len(stuck) / max(1, len(short)),
            "short_jct_mean_s": statistics.fmean(c.jct_s for c in short) if short else None,
            "longest_10pct_jct_mean_s": statistics.fmean(c.jct_s for c in longest),
            "preemptions": sum(c.num_preemptions for c in completions)}


def quantiles(values: list[float], points: int = 201) -> list[float]:
    """The distribution in `points` evenly spaced percentiles (a CDF small enough to store)."""
    return [percentile(values, 100 * i / (points - 1)) for i in range(points)]


def plot(runs: list[dict], out: str) -> None:
    """Per cost model: JCT CDFs at the highest load, and mean / p99 JCT against load."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(out, dpi=110)
