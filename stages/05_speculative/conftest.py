"""Fixtures for stage 05's tests (the CLI's and the trainer's)."""
import pytest

from course.s01_decode_loop.testing import byte_tokenizer, save_hf_folder, tiny_model, torch_threads


@pytest.fixture(scope="session")
def chat_folder(tmp_path_factory):
    """A tiny model (mha_untied) whose tokenizer has a chat template (the trainer formats prompts
    as chat). It gets a tokenizer of its own: the shared byte_tok fixture keeps no template."""
    path = tmp_path_factory.mktemp("tiny_chat")
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    save_hf_folder(tiny_model("mha_untied"), tokenizer, path)
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    with torch_threads(1):  # tiny models: see torch_threads
        yield
