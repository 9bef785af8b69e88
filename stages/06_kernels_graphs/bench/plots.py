"""The notebook's figures, drawn here so the notebook shows the idea, not the plotting code."""
from __future__ import annotations

from .roofline import decode_cost


def roofline_points(model, rows: list[dict], context: int, variant: str = "runner+fused") -> list[tuple]:
    """(batch, arithmetic intensity in FLOP/byte, achieved GFLOP/s) of each measured decode step
    of `variant` (benchmark.decode_table's rows)."""
    points = []
    for r in rows:
        if r["variant"] == variant:
            cost = decode_cost(model, r["batch"], context)
            points.append((r["batch"], cost.intensity, cost.flops / (r["step_ms"] / 1e3) / 1e9))
    return points


def plot_roofline(model, rows: list[dict], context: int, bandwidth: float, flops: float, variant: str = "runner+fused"):
    """The machine's roof, min(peak, intensity x bandwidth), and each batch's decode step under
    it, on log-log axes. Returns the figure."""
    import matplotlib.pyplot as plt

    xs = [2 ** i / 8 for i in range(12)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(xs, [min(flops, x * bandwidth) / 1e9 for x in xs], "k-", label="this CPU's roof")
    for batch, intensity, achieved in roofline_points(model, rows, context, variant):
        ax.plot(intensity, achieved, "o", label=f"decode step, B={batch}")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    ax.legend()
    ax.grid(True, which="both", alpha=.3)
    return fig
