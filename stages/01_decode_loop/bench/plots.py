"""The notebooks' pictures of one generation's timing (stages 01 and 02 draw them).

    fig, ax = plot_token_times({"naive loop": out.token_times_s}, first_position=len(prompt_ids))

Left: the milliseconds each generated token took, by its position in the sequence. Right: the
seconds so far, by tokens generated. `token_times_s` is a GenerationOutput's: the time of each
token since the request started, so token 0's is the time to the first token.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .measure import per_token_seconds


def plot_token_times(runs: dict[str, list[float]], first_position: int, titles=("time per token", "total time"),
                     log: bool = False):
    """One line per run (name -> token_times_s) in each panel. Returns (figure, axes)."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
    for name, times in runs.items():
        ax[0].plot(range(first_position, first_position + len(times)), [t * 1e3 for t in per_token_seconds(times)],
                   ".", ms=3, label=name)
        ax[1].plot(range(1, len(times) + 1), times, label=name)
    ax[0].set(xlabel="position of the generated token", ylabel="ms for this token", title=titles[0],
              yscale="log" if log else "linear")
    ax[1].set(xlabel="tokens generated", ylabel="seconds so far", title=titles[1])
    if len(runs) > 1:
        ax[0].legend()
    fig.tight_layout()
    return fig, ax
