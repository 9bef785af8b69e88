"""The notebook's pictures of the engine at work.

    plot_step_tokens(engine.step_log)        prefill and decode tokens in each step's forward
    pool_stack(snapshots, ax, title)         blocks per step, stacked by owner (StepRecorder's snapshots)
    pool_image(snapshots, ax, title)         who holds each physical block, step by step
    plot_pool_snapshot(snapshot)             one watch snapshot's pool, drawn as the dashboard draws it
    plot_load(result)                        the load benchmark: output tok/s and TTFT p99 per system
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from ..watch.recorder import CACHED, FREE, SHARED

DASHBOARD_COLOURS = ["#e6e6e6", "#9ecae1", "#3182bd", "#8e44ad"]  # free, cached, used, shared


def plot_step_tokens(step_log: list[dict]):
    """Bars per step: the prefill chunks' tokens, with the decodes' tokens stacked on top."""
    prefill = [sum(n for _, n, _ in s["chunks"] if n > 1) for s in step_log]
    decode = [sum(1 for _, n, _ in s["chunks"] if n == 1) for s in step_log]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(range(len(prefill)), prefill, label="prefill tokens")
    ax.bar(range(len(decode)), decode, bottom=prefill, label="decode tokens")
    ax.set(xlabel="step", ylabel="tokens in the forward pass")
    ax.legend()
    return fig, ax


def pool_stack(snaps, ax, title: str, show_empty: bool = True) -> None:
    """Blocks per step: each request's own, shared ones, cached ones (and empty ones), stacked;
    a dashed line where a request was preempted."""
    owners = np.array([s.pool_owners() for s in snaps])
    rids = sorted({r for s in snaps for r in s.tables})
    bands = [(f"request {r}", plt.cm.tab20(r % 20), owners == r) for r in rids]
    bands += [("shared", "0.2", owners == SHARED), ("cached (free)", "0.7", owners == CACHED)]
    bands += [("empty", "0.93", owners == FREE)] if show_empty else []
    bottom = np.zeros(len(snaps))
    for label, colour, mask in bands:
        ax.bar(range(len(snaps)), mask.sum(1), 1.0, bottom=bottom, color=colour, label=label)
        bottom += mask.sum(1)
    for k, (step, r) in enumerate((s.step, r) for s in snaps for r in s.preempted):
        ax.axvline(step, color="k", ls="--", lw=1)
        ax.text(step + 0.6, bottom.max() * (0.97 - 0.1 * k), f"request {r} preempted", fontsize=8, va="top")
    ax.set(xlabel="step", ylabel="blocks", title=title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5), ncol=1 + len(rids) // 12)


def pool_image(snaps, ax, title: str) -> None:
    """One row per step, one column per physical block (up to the last one the run touched),
    coloured by the request holding it; dark: shared, grey: cached, white: empty."""
    owners = np.array([s.pool_owners() for s in snaps])
    owners = owners[:, :(owners != FREE).any(0).nonzero()[0].max() + 1]
    image = np.ones((*owners.shape, 4))
    image[owners == CACHED] = (0.7, 0.7, 0.7, 1)
    image[owners == SHARED] = (0.2, 0.2, 0.2, 1)
    image[owners >= 0] = plt.cm.tab20(owners[owners >= 0] % 20)
    ax.imshow(image, aspect="auto", interpolation="nearest")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="physical block id", ylabel="step", title=title)


def pool_cells(pool: dict) -> list[int]:
    """A snapshot's pool (run-lengths of cell states) as one state per cell."""
    return [state for state, run in zip(pool["runs"][::2], pool["runs"][1::2]) for _ in range(run)]


def plot_pool_snapshot(snapshot: dict, width: int = 7):
    """The pool `width` cells a row in the dashboard's colours; the cells a preemption just
    freed outlined in orange."""
    pool, cells = snapshot["pool"], pool_cells(snapshot["pool"])
    fig, ax = plt.subplots(figsize=(6, 1.6))
    rows = [cells[i:i + width] for i in range(0, len(cells), width)]
    rows[-1] += [0] * (width - len(rows[-1]))  # the last row padded as free
    ax.imshow(rows, cmap=ListedColormap(DASHBOARD_COLOURS), vmin=0, vmax=len(DASHBOARD_COLOURS) - 1)
    for c in pool["preempted_cells"]:
        ax.scatter(c % width, c // width, marker="s", s=260, facecolors="none", edgecolors="#e6550d", linewidths=2)
    ax.set_title(", ".join(f"{name} {pool['counts'][name]}" for name in (*pool["states"], "preempted")), fontsize=9)
    ax.axis("off")
    return fig, ax


def plot_load(result: dict):
    """Two panels, a group of bars per system and one bar per arrival rate: output tokens/s
    (log scale, with the compute ceiling) and TTFT p99."""
    systems = list(dict.fromkeys(r["system"] for r in result["rows"]))
    rates = list(dict.fromkeys(r["rate"] for r in result["rows"]))
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
    for k, rate in enumerate(rates):
        rows = [r for r in result["rows"] if r["rate"] == rate]
        ax[0].bar([i + 0.4 * k for i in range(len(rows))], [r["output_tok_s"] for r in rows], 0.4, label=f"rate {rate}")
        ax[1].bar([i + 0.4 * k for i in range(len(rows))], [r["ttft_p99"] for r in rows], 0.4, label=f"rate {rate}")
    for a, title in zip(ax, ["output tokens/s", "TTFT p99 (s)"]):
        a.set_xticks(range(len(systems)), systems, rotation=20)
        a.set_title(title)
        a.legend()
    ax[0].set_yscale("log")
    ax[0].axhline(result["ceiling_tok_s"], ls="--", c="gray")
    ax[0].text(0, result["ceiling_tok_s"] * 0.9, "compute ceiling")
    fig.tight_layout()
    return fig, ax
