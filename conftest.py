"""Fixtures shared by every stage's tests (pytest loads this root conftest for any path)."""
import os

import pytest
import torch

from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer, save_hf_folder, tiny_model


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny(request):
    """Each tiny random-weight config in turn: (name, model)."""
    return request.param, tiny_model(request.param, seed=0)


@pytest.fixture(scope="session")
def byte_tok():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, byte_tok):
    """A tiny model saved as a Hugging Face folder, for tests that load by path (CLIs, servers)."""
    path = tmp_path_factory.mktemp("tiny")
    save_hf_folder(tiny_model("gqa_tied", seed=0), byte_tok, path)
    return path


@pytest.fixture(scope="session")
def smollm2():
    """The real default model (SmolLM2-135M-Instruct), fetched and converted on first use."""
    from course.s01_decode_loop.weights import load_model

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return load_model()


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where there is no CUDA device; their CPU twins still run."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
