"""Families beyond the Llama shape served by `python -m course.final serve`: a folder transformers
wrote, greedy tokens through the openai client equal transformers' own full forward, past the
sliding windows; /v1/models names the architecture; the start-up says what it changed and why."""
import importlib

import openai
import pytest

from course.final.testing import start_cli_server as start
from course.final.testing import stop_cli_server as stop
from course.s01_decode_loop.families import FAMILIES
from course.s01_decode_loop.testing import greedy_reference_uncached, save_transformers_model

SAID = {"gemma3_text": "sliding window of 8 tokens in 5 of 6 layers", "gpt_oss": "attention backend torch: the model's attention sinks",
        "qwen3_next": "state cache:"}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_families_serve_a_folder_through_the_openai_client(tmp_path, byte_tok, model_type):
    module = importlib.import_module(f"course.s01_decode_loop.families.{FAMILIES[model_type][0]}")
    hf = save_transformers_model(module.tiny_config(), byte_tok, tmp_path)
    prompt = list(range(40, 70))  # past every tiny config's window
    want = greedy_reference_uncached(hf, prompt, 12)
    proc, url = start("--model", str(tmp_path), "--kv-memory", "1MiB", "--block-size", "4",
                      "--served-model-name", "tiny")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
                                        extra_body={"ignore_eos": True})
        card = client.models.list().data[0]
    finally:
        assert stop(proc) == 0
    assert out.choices[0].logprobs.tokens == [byte_tok.decode([t]) for t in want]
    assert card.model_extra["architecture"] == FAMILIES[model_type][2]
    assert SAID[model_type] in proc.stdout.read()
