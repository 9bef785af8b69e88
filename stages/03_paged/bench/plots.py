"""The notebook's pictures of what paging buys, drawn from `benchmark.py`'s results.

    plot_capacity(memory_report(...))   requests that fit, and the share of reserved slots used
    plot_prefix_ttft(prefix_ttft(...))  each request's TTFT with prefix caching off and on
"""
from __future__ import annotations

import matplotlib.pyplot as plt

LAYOUTS = ("contiguous", "paged")


def plot_capacity(mem: dict):
    """Two panels over the KV budgets: requests admitted at once, and % of reserved slots used."""
    budgets = [r["budget_tokens"] for r in mem["rows"]]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
    for name in LAYOUTS:
        ax[0].plot(budgets, [r[name]["admitted"] for r in mem["rows"]], "o-", label=name)
        ax[1].plot(budgets, [100 * r[name]["utilization"] for r in mem["rows"]], "o-", label=name)
    ax[0].set(xlabel="KV budget (tokens)", ylabel="requests that fit at once", title="capacity")
    ax[1].set(xlabel="KV budget (tokens)", ylabel="% of reserved slots used", title="utilization", ylim=(0, 105))
    for a in ax:
        a.set_xscale("log", base=2)
        a.minorticks_off()
        a.set_xticks(budgets, [f"{b // 1024}k" for b in budgets])
    ax[0].legend()
    fig.tight_layout()
    return fig, ax


def plot_prefix_ttft(pre: dict):
    """One pair of bars per request (same system prompt, different question): TTFT in ms."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(pre["prompt_tokens"]))
    for shift, key, label in ((-0.2, "caching_off", "prefix caching off"), (0.2, "caching_on", "prefix caching on")):
        ax.bar([i + shift for i in x], [t * 1e3 for t in pre[key]["ttft_s"]], 0.4, label=label)
    ax.set(xlabel="request (same system prompt, different question)", ylabel="TTFT (ms)")
    ax.legend()
    fig.tight_layout()
    return fig, ax
