"""The loader serves every family of families/ from a folder transformers wrote: the right
model class, and greedy tokens equal to transformers' own full forward past the windows."""
import importlib
import json

import pytest

from course.s01_decode_loop.families import FAMILIES
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import greedy_reference_uncached, save_transformers_model
from course.s01_decode_loop.weights import ModelLoadError, load_model


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_families_load_a_folder_and_answer_as_transformers(tmp_path, byte_tok, model_type):
    module = importlib.import_module(f"course.s01_decode_loop.families.{FAMILIES[model_type][0]}")
    hf = save_transformers_model(module.tiny_config(), byte_tok, tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded.model).__name__ == FAMILIES[model_type][2] == loaded.config.architecture
    prompt = list(range(30, 50))  # longer than every tiny config's window
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    assert generate_naive(loaded.model, byte_tok, prompt, greedy).token_ids == greedy_reference_uncached(hf, prompt, 8)


def test_families_an_unknown_model_type_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon_mamba", "vocab_size": 8}))
    with pytest.raises(ModelLoadError, match="falcon_mamba"):
        load_model(tmp_path)
