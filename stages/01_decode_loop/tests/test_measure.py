"""The one percentile every benchmark and the dashboard report: numpy's default (linear
interpolation between the closest ranks), q in 0..100, None for no values."""
import random

import numpy as np
import pytest

from course.s01_decode_loop.measure import percentile


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy(n):
    xs = [random.Random(n).random() for _ in range(n)]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
