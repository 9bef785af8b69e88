"""The notebook's pictures draw the benchmark's own numbers: admitted requests and slot use per
budget, and each request's TTFT with prefix caching off and on."""
import matplotlib

matplotlib.use("Agg")  # no display: draw into memory

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course.s03_paged.bench.plots import plot_capacity, plot_prefix_ttft  # noqa: E402
from course.s03_paged.memory_sim import simulate  # noqa: E402


def test_plot_capacity_draws_both_layouts_per_budget():
    lengths = [(30, 200), (10, 40), (50, 900), (5, 5)] * 10
    mem = {"rows": [{"budget_tokens": b, **simulate(lengths, b)} for b in (2048, 8192)]}
    fig, ax = plot_capacity(mem)
    admitted, used = ax[0].get_lines(), ax[1].get_lines()
    assert [line.get_label() for line in admitted] == ["contiguous", "paged"]
    assert list(admitted[1].get_ydata()) == [r["paged"]["admitted"] for r in mem["rows"]]
    assert list(used[0].get_ydata()) == pytest.approx([100 * r["contiguous"]["utilization"] for r in mem["rows"]])
    assert [t.get_text() for t in ax[0].get_xticklabels()] == ["2k", "8k"]
    plt.close(fig)


def test_plot_prefix_ttft_draws_a_bar_per_request_each_way():
    pre = {"prompt_tokens": [300, 305, 310], "caching_off": {"ttft_s": [0.9, 0.8, 0.85]},
           "caching_on": {"ttft_s": [0.9, 0.1, 0.12]}}
    fig, ax = plot_prefix_ttft(pre)
    off, on = ax.containers
    assert [bar.get_height() for bar in on] == pytest.approx([900, 100, 120])
    assert [bar.get_height() for bar in off] == pytest.approx([900, 800, 850])
    assert off.get_label() == "prefix caching off"
    plt.close(fig)
