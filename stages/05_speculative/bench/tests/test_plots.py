"""The notebook's figures draw what they are given: every method's points, in the right panel."""
import matplotlib
import pytest
import torch

matplotlib.use("Agg")  # no display: draw into memory

import matplotlib.pyplot as plt  # noqa: E402

from course.s05_speculative.bench.plots import distributions_figure, methods_figure  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_methods_figure_plots_each_methods_rows_in_its_workloads_column():
    rows = [{"workload": w, "method": m, "k": k, "mean_accepted_length": 1 + k / 10, "speedup": 2.0 if w == "json" else 0.5}
            for w in ("chat", "json") for m in ("draft", "lookup", "eagle") for k in (1, 2)]
    rows.append({"workload": "json", "method": "eagle-tree", "k": 5, "mean_accepted_length": 2.3, "speedup": 0.8})
    fig = methods_figure(rows, workloads=("chat", "json"))
    top, bottom = fig.axes[:2], fig.axes[2:]
    assert [ax.get_title() for ax in top] == ["chat", "json"]
    eagle = next(line for line in bottom[1].lines if line.get_label() == "eagle")
    assert list(eagle.get_xdata()) == [1, 2] and list(eagle.get_ydata()) == [2.0, 2.0]
    tree = next(line for line in top[1].lines if line.get_label() == "eagle tree")
    assert list(tree.get_xdata()) == [5] and list(tree.get_ydata()) == [2.3]
    chat_tree = next(line for line in top[0].lines if line.get_label() == "eagle tree")
    assert len(chat_tree.get_xdata()) == 0  # no tree rows for chat: nothing drawn


def test_distributions_figure_draws_three_bars_per_token():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    ax = distributions_figure(p, q, p).axes[0]
    heights = [bar.get_height() for bar in ax.patches]
    assert len(heights) == 9 and heights[:3] == p.tolist() and heights[3:6] == q.tolist()
