"""The scheduling runs' picture and table say what the runs hold."""
import matplotlib

matplotlib.use("Agg")

from course.final.scheduling.plots import plot_runs, runs_table  # noqa: E402


def run(model: str, load: float, policy: str, jct_mean: float) -> dict:
    summary = {"jct_mean_s": jct_mean, "jct_p99_s": 3 * jct_mean, "ttft_p99_s": 0.5, "short_stuck_frac": 0.25}
    return {"cost_model": model, "load": load, "policy": policy, "summary": summary,
            "jct_quantiles_s": [jct_mean / 2, jct_mean, 4 * jct_mean]}


RUNS = [run(model, load, policy, jct) for model in ("cpu (measured)", "gpu-like (derived)")
        for load, policy, jct in ((0.9, "fcfs", 10.0), (0.9, "mlfq", 12.0), (1.0, "fcfs", 20.0), (1.0, "mlfq", 30.0))]


def test_plot_runs_draws_each_policy_per_cost_model():
    fig = plot_runs(RUNS)
    cdf, against_load = fig.axes[0], fig.axes[1]
    assert len(fig.axes) == 4 and "load 1.0" in cdf.get_title()
    assert [line.get_label() for line in cdf.get_lines()] == ["fcfs", "mlfq"]  # the highest load's runs only
    means = [line for line in against_load.get_lines() if line.get_label() == "mlfq mean"]
    assert list(means[0].get_xdata()) == [0.9, 1.0] and list(means[0].get_ydata()) == [12.0, 30.0]


def test_runs_table_has_one_line_per_run():
    lines = runs_table(RUNS).splitlines()
    assert len(lines) == 1 + len(RUNS) and lines[0].split()[:2] == ["cost", "model"]
    assert lines[2].split()[-5:] == ["mlfq", "12.0", "36.0", "0.50", "25.0%"]
