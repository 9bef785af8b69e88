"""The harness's helpers: the one percentile every benchmark and the dashboard report (numpy's
default, linear interpolation between the closest ranks, q in 0..100, None for no values) and the
threads a benchmark or notebook gives torch."""
import os
import random

import numpy as np
import pytest

from course.s01_decode_loop.bench.measure import percentile


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy(n):
    xs = [random.Random(n).random() for _ in range(n)]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None


def test_results_are_stamped_with_machine_command_and_commit(tmp_path):
    import json
    import subprocess

    from course.s01_decode_loop.bench.measure import write_json

    write_json(tmp_path / "r.json", {"rows": [{"name": "a", "x": 1}]})
    stamped = json.loads((tmp_path / "r.json").read_text())
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:  # a git checkout: the commit of the code, `+dirty` if it was edited
        assert stamped["commit"].split("+")[0] == head
    else:     # a copy without git history says so rather than inventing one
        assert stamped["commit"] is None
    assert stamped["command"].startswith("python -m") and stamped["machine"]["cores"] >= 1


def test_cpu_threads_takes_omp_num_threads_else_every_core(monkeypatch):
    from course.s01_decode_loop.bench.measure import cpu_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads() == os.cpu_count()
