"""The timing picture draws what it is given: each token's own time by position, and the running total."""
import matplotlib

matplotlib.use("Agg")  # no display: draw into memory

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course.s01_decode_loop.bench.measure import per_token_seconds  # noqa: E402
from course.s01_decode_loop.bench.plots import plot_token_times  # noqa: E402


def test_per_token_seconds_undoes_the_running_total():
    assert per_token_seconds([0.5, 0.75, 1.5]) == [0.5, 0.25, 0.75]
    assert per_token_seconds([]) == []


def test_plot_token_times_draws_each_run_by_position_and_in_total():
    runs = {"naive": [0.2, 0.5, 0.9], "cached": [0.2, 0.3, 0.4]}
    fig, ax = plot_token_times(runs, first_position=10, log=True)
    per_token, total = ax[0].get_lines(), ax[1].get_lines()
    assert [line.get_label() for line in per_token] == ["naive", "cached"]
    assert list(per_token[0].get_xdata()) == [10, 11, 12]
    assert list(per_token[0].get_ydata()) == pytest.approx([200, 300, 400])  # ms, each token's own
    assert list(total[1].get_ydata()) == [0.2, 0.3, 0.4] and list(total[1].get_xdata()) == [1, 2, 3]
    assert ax[0].get_yscale() == "log" and ax[0].get_legend() is not None
    plt.close(fig)
