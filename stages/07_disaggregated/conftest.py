"""Fixtures for stage 07's tests."""
import pytest
import torch

from course.s01_decode_loop.testing import save_hf_folder, tiny_model


@pytest.fixture(scope="session")
def untied_folder(tmp_path_factory, byte_tok):
    """A tiny untied model saved as a folder for worker processes. Untied, because a tied tiny
    model's greedy output repeats one token, and equal outputs would then prove little."""
    path = tmp_path_factory.mktemp("tiny_mqa")
    save_hf_folder(tiny_model("mqa_odd_heads", seed=0), byte_tok, path)
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """This stage's tests run tiny models, which a second thread does not speed up; and where other
    work shares the two cores, two threads wait for each other at every op (a tiny step ran 50x
    slower so, measured). So each test runs on one thread, and the count is put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
