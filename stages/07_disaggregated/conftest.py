"""Fixtures for stage 07's tests."""
import pytest

from course.s01_decode_loop.testing import save_hf_folder, tiny_model, torch_threads


@pytest.fixture(scope="session")
def untied_folder(tmp_path_factory, byte_tok):
    """A tiny untied model saved as a folder for worker processes. Untied, because a tied tiny
    model's greedy output repeats one token, and equal outputs would then prove little."""
    path = tmp_path_factory.mktemp("tiny_mqa")
    save_hf_folder(tiny_model("mqa_odd_heads", seed=0), byte_tok, path)
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    with torch_threads(1):  # tiny models: see torch_threads
        yield
