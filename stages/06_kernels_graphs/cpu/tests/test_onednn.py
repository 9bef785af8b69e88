"""Products of many rows through oneDNN (onednn.py): equal to torch's linear, the choice timed
once per shape, forced by the environment, refused by name when unknown."""
import pytest
import torch
import torch.nn.functional as F

from course.s06_kernels_graphs.cpu import onednn
from course.s06_kernels_graphs.cpu.split_linear import SplitLinear

pytestmark = pytest.mark.skipif(not onednn.onednn_available(), reason="this torch has no oneDNN matmul")


@pytest.mark.parametrize("m,n,k", [(65, 96, 64), (300, 40, 72), (128, 1536, 576)])
def test_onednn_products_equal_linear(m, n, k):
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    torch.testing.assert_close(onednn.onednn_product(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_the_choice_is_timed_once_per_shape_and_the_environment_can_force_it(monkeypatch):
    monkeypatch.delenv("COURSE_MANY_ROWS_PRODUCT", raising=False)
    w = torch.randn(96, 64)
    first = onednn.choice(w)
    assert first in onednn.CHOICES and onednn._chosen[(96, 64)] == first
    monkeypatch.setattr(onednn, "_faster", lambda weight: pytest.fail("timed twice"))
    assert onednn.choice(torch.randn(96, 64)) == first
    for forced in onednn.CHOICES:
        monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", forced)
        assert onednn.choice(w) == forced
    monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", "blas")
    with pytest.raises(ValueError, match="mkl, onednn"):
        onednn.choice(w)


@pytest.mark.parametrize("forced", onednn.CHOICES)
def test_split_linears_of_many_rows_equal_linear_either_way(forced, monkeypatch):
    monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", forced)
    linear = torch.nn.Linear(64, 96)
    split = SplitLinear(linear, 2)
    for rows in (3, onednn.MANY_ROWS + 1, 200):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(split(x), linear(x), atol=1e-5, rtol=1e-5)
