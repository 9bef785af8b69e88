"""The notebook's pictures draw what they are given: tokens per step, the pool per step by owner,
who holds each block, a watch snapshot's pool, the load benchmark's bars."""
import matplotlib

matplotlib.use("Agg")  # no display: draw into memory

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course.s04_continuous_batching.bench.plots import (plot_load, plot_pool_snapshot,  # noqa: E402
                                                        plot_step_tokens, pool_image, pool_stack)
from course.s04_continuous_batching.watch.recorder import Snapshot  # noqa: E402
from course.s04_continuous_batching.watch.snapshot import pool_json  # noqa: E402


def three_steps():
    """A pool of 6 blocks: request 0 holds 0 and 1; request 1 joins sharing block 0; request 0
    is preempted, and its block 1 stays cached."""
    return [Snapshot(0, {0: [0, 1]}, 6, 4, [], [(0, 8)], [], [], [0], []),
            Snapshot(1, {0: [0, 1], 1: [0, 2]}, 6, 3, [], [(0, 1), (1, 5)], [], [], [0, 1], []),
            Snapshot(2, {1: [0, 2]}, 6, 3, [1], [(1, 1)], [0], [], [1], [0])]


def test_plot_step_tokens_stacks_decodes_on_prefill_chunks():
    fig, ax = plot_step_tokens([{"chunks": [(0, 8, 0)]}, {"chunks": [(0, 1, 8), (1, 5, 0), (2, 1, 3)]}])
    prefill, decode = ax.containers
    assert [b.get_height() for b in prefill] == [8, 5] and [b.get_height() for b in decode] == [0, 2]
    assert [b.get_y() for b in decode] == [8, 5]
    plt.close(fig)


def test_pool_stack_counts_every_block_once_per_step_and_marks_the_preemption():
    fig, ax = plt.subplots()
    pool_stack(three_steps(), ax, "pool")
    bands = {c.get_label(): [b.get_height() for b in c] for c in ax.containers}
    assert bands == {"request 0": [2, 1, 0], "request 1": [0, 1, 2], "shared": [0, 1, 0],
                     "cached (free)": [0, 0, 1], "empty": [4, 3, 3]}
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [2]  # the dashed line at the preemption
    assert [t.get_text() for t in ax.texts] == ["request 0 preempted"]
    plt.close(fig)


def test_pool_image_colours_each_block_by_who_holds_it():
    fig, ax = plt.subplots()
    pool_image(three_steps(), ax, "who")
    image = ax.get_images()[0].get_array()
    assert image.shape == (3, 3, 4)  # three steps, up to block 2 (the last one touched)
    assert tuple(image[1, 0]) == (0.2, 0.2, 0.2, 1) and tuple(image[2, 1]) == (0.7, 0.7, 0.7, 1)
    assert tuple(image[0, 2]) == (1, 1, 1, 1)  # empty at step 0
    assert tuple(image[0, 0]) == tuple(image[0, 1]) != tuple(image[2, 0])  # request 0's colour, then request 1's
    plt.close(fig)


def test_plot_pool_snapshot_draws_the_cells_and_outlines_the_preempted_ones():
    states = bytearray([0, 2, 2, 3, 1, 0, 0, 2, 1])  # free, used, used, shared, cached, ...
    fig, ax = plot_pool_snapshot({"pool": pool_json(states, preempted={1, 2})}, width=7)
    cells = np.asarray(ax.get_images()[0].get_array())
    assert cells.shape == (2, 7) and list(cells.ravel()[:9]) == list(states)
    outlined = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert outlined == [(1, 0), (2, 0)]  # blocks 1 and 2: (column, row)
    assert "preempted 2" in ax.get_title() and "shared 1" in ax.get_title()
    plt.close(fig)


def test_plot_load_draws_a_bar_per_system_and_rate():
    rows = [{"system": s, "rate": r, "output_tok_s": t, "ttft_p99": p}
            for r, (a, b) in ((1.0, (10, 20)), (float("inf"), (12, 40))) for s, t, p in
            (("sequential", a, 3.0), ("continuous", b, 0.5))]
    fig, ax = plot_load({"rows": rows, "ceiling_tok_s": 1000.0})
    assert [[b.get_height() for b in c] for c in ax[0].containers] == [[10, 20], [12, 40]]
    assert [t.get_text() for t in ax[0].get_xticklabels()] == ["sequential", "continuous"]
    assert ax[0].get_lines()[0].get_ydata()[0] == pytest.approx(1000.0) and ax[0].get_yscale() == "log"
    plt.close(fig)
