"""Every key of every supported family's config is read, inert or refused by name (config_keys.py)."""
import dataclasses
import json

import pytest
from transformers import CONFIG_MAPPING, AutoConfig

from course.s01_decode_loop.config import SUPPORTED_MODEL_TYPES, ModelConfig
from course.s01_decode_loop.config_keys import CHECKED, INERT, READ
from course.s01_decode_loop.testing import TINY_CONFIGS, save_hf_folder, tiny_model
from course.s01_decode_loop.weights import load_model

# for each checked key: a value the engine cannot serve, and the "off" value it accepts
REFUSED = {"hidden_act": "gelu", "layer_types": ["full_attention", "linear_attention"], "partial_rotary_factor": 0.5}
ACCEPTED = {"hidden_act": "silu", "layer_types": ["full_attention"] * 2, "partial_rotary_factor": 1.0}


def family_keys(model_type: str) -> set[str]:
    """The keys transformers' config class of this family writes or accepts: its default
    instance's to_dict(), its dataclass fields and its aliases (attribute_map, e.g. num_experts)."""
    cls = CONFIG_MAPPING[model_type]
    keys = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    if dataclasses.is_dataclass(cls):
        keys |= {f.name for f in dataclasses.fields(cls)}
    return keys


def default_dict(model_type: str) -> dict:
    return AutoConfig.for_model(model_type).to_dict()


def test_config_keys_kinds_do_not_overlap():
    assert not (READ & INERT) and not (READ & set(CHECKED)) and not (INERT & set(CHECKED))
    assert set(REFUSED) == set(ACCEPTED) == set(CHECKED), "give each checked key a refused and an accepted value"


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_config_keys_every_key_of_a_family_is_read_inert_or_checked(model_type):
    unsorted = family_keys(model_type) - READ - INERT - set(CHECKED)
    assert not unsorted, (f"{model_type} config keys {sorted(unsorted)} are neither read, inert nor checked: "
                          "sort each into READ, INERT or CHECKED in config_keys.py (check the family's modeling file)")


class _RecordingDict(dict):
    """A config dict that remembers which keys were looked up."""

    def __init__(self, *args):
        super().__init__(*args)
        self.looked_up = set()

    def get(self, key, default=None):
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.looked_up.add(key)
        return super().__getitem__(key)


def test_config_keys_every_read_key_is_looked_up_by_from_hf():
    """READ is not a list of wishes: from_hf looks each key up, for some family's config."""
    legacy = {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}  # transformers 4 style
    looked_up = set()
    for model_type in SUPPORTED_MODEL_TYPES:
        for d in (default_dict(model_type), {**default_dict(model_type), "rope_parameters": None, **legacy,
                                             "num_local_experts": None}):
            recording = _RecordingDict(d)
            ModelConfig.from_hf(type("HfConfig", (), {"to_dict": lambda self, r=recording: r})())
            looked_up |= recording.looked_up
    assert READ - looked_up == set()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_config_keys_default_config_of_every_family_loads(model_type):
    """Each family's default transformers config passes the checks (its checked keys are all "off")."""
    hf = CONFIG_MAPPING[model_type]()
    config = ModelConfig.from_hf(hf)
    assert config.model_type == model_type
    assert config.num_experts == (getattr(hf, "num_local_experts", None) or getattr(hf, "num_experts", 0))
    assert config.qkv_bias == (model_type in ("qwen2", "qwen2_moe"))
    if model_type in ("qwen2", "qwen3", "qwen2_moe"):  # all full attention, written out by transformers
        assert set(hf.to_dict()["layer_types"]) == {"full_attention"}


@pytest.mark.parametrize("key", sorted(CHECKED))
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_config_keys_a_checked_key_is_refused_by_name_and_its_off_value_accepted(model_type, key):
    d = default_dict(model_type)
    with pytest.raises(ValueError, match=key):
        ModelConfig.from_hf({**d, key: REFUSED[key]})
    assert ModelConfig.from_hf({**d, key: ACCEPTED[key]}) == ModelConfig.from_hf({k: v for k, v in d.items()
                                                                                  if k != key})


def test_config_keys_partial_rotary_factor_is_refused_inside_the_rope_dict_too():
    d = {**default_dict("llama"), "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                      "partial_rotary_factor": 0.5}}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ModelConfig.from_hf(d)


def test_config_keys_qwen_sliding_layers_are_read_as_transformers_writes_them():
    """Qwen2's own class with its sliding window on writes sliding layers into layer_types (from
    max_window_layers on); a list that says so while the flag is off is refused, naming the key."""
    hf = CONFIG_MAPPING["qwen2"](num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=2)
    assert ModelConfig.from_hf(hf).layer_windows == (None, None, 64, 64)
    assert ModelConfig.from_hf({**hf.to_dict(), "layer_types": None}).layer_windows == (None, None, 64, 64)
    assert ModelConfig.from_hf({**hf.to_dict(), "sliding_window": hf.max_position_embeddings}).layer_windows == ()
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_hf({**hf.to_dict(), "use_sliding_window": False})


@pytest.mark.parametrize("key", sorted(CHECKED))
def test_config_keys_the_loader_refuses_a_checked_key_by_name(tmp_path, byte_tok, key):
    save_hf_folder(tiny_model("gqa_tied"), byte_tok, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: REFUSED[key]}))
    with pytest.raises(ValueError, match=key):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, key: ACCEPTED[key]}))
    assert load_model(tmp_path).config == tiny_model("gqa_tied").config


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_config_keys_to_hf_passes_the_checks(name):
    """What we write for tiny test models reads back the same, directly and through transformers' class."""
    config = TINY_CONFIGS[name]
    if config.model_type == "mixtral":  # every layer is MoE: the only MLP width a Mixtral config has is its experts'
        config = dataclasses.replace(config, intermediate_size=config.moe_intermediate_size)
    assert ModelConfig.from_hf(config.to_hf()) == config
    assert ModelConfig.from_hf(AutoConfig.for_model(**config.to_hf())) == config


def test_config_keys_a_qwen2_moe_config_without_qkv_bias_has_the_biases():
    """Qwen1.5-MoE's config.json predates the key; its class, like its checkpoint, has q/k/v biases."""
    d = {k: v for k, v in default_dict("qwen2_moe").items() if k != "qkv_bias"}
    assert ModelConfig.from_hf(d).qkv_bias and not ModelConfig.from_hf({**d, "qkv_bias": False}).qkv_bias


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_keys_a_config_json_leaves_out_read_as_transformers_reads_them(tmp_path, model_type):
    """Only the sizes written (as a hand-made or old config.json may): the norm's epsilon, RoPE's
    base, the KV heads and (Mistral) the sliding window come out as transformers' class fills them."""
    sizes = {"model_type": model_type, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "max_position_embeddings": 8192}
    if "moe" in model_type or model_type == "mixtral":
        sizes |= {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(sizes))
    ours, theirs = ModelConfig.from_json(tmp_path / "config.json"), AutoConfig.from_pretrained(tmp_path)
    theta = (getattr(theirs, "rope_parameters", None) or {}).get("rope_theta") or theirs.rope_theta
    assert (ours.rms_norm_eps, ours.rope_theta, ours.num_key_value_heads) == (theirs.rms_norm_eps, theta, 2)
    window = getattr(theirs, "sliding_window", None) if model_type in ("mistral", "mixtral") else None
    assert ours.max_position_embeddings == 8192
    assert ours.layer_windows == ((window,) * 2 if window else ())  # Mistral's 4096 slides in every layer
