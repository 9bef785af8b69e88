"""off_the_main_thread: the work runs on another thread, its result or its exception comes back."""
import threading

import pytest

from course.final.torch_threads import off_the_main_thread


def test_runs_elsewhere_and_returns_the_result():
    assert off_the_main_thread(lambda a, b=0: (threading.current_thread().name, a + b), 2, b=3) == ("model-loader", 5)


def test_an_exception_is_raised_on_the_callers_thread():
    def fails():
        raise ValueError("no model at that path")

    with pytest.raises(ValueError, match="no model at that path"):
        off_the_main_thread(fails)
