"""Loading: HF folders round-trip, and every broken input gets an error that says how to fix it."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from course.s01_decode_loop import default_model
from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.testing import save_hf_folder, save_transformers_model, tiny_model
from course.s01_decode_loop.weights import ModelLoadError, load_model


def test_weights_hf_folder_round_trip(tmp_path, byte_tok):
    for name in ["gqa_tied", "mha_untied", "qwen3"]:
        model = tiny_model(name, seed=3)
        save_hf_folder(model, byte_tok, tmp_path / name)
        loaded = load_model(tmp_path / name)
        assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight or \
            not model.config.tie_word_embeddings
        for (k, a), b in zip(model.state_dict().items(), loaded.model.state_dict().values()):
            assert torch.equal(a, b), k
        # transformers reads the same folder and agrees
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / name, dtype=torch.float32)
        ids = torch.tensor([1, 2, 3, 4])
        ours = loaded.model.compute_logits(
            loaded.model(ids, FullCausalAttention(), AttentionMetadata.for_full_sequences([4])))
        torch.testing.assert_close(ours, hf(ids[None]).logits[0].detach(), atol=1e-5, rtol=1e-4)
        assert loaded.eos_token_ids == [257]


def test_weights_a_qwen3_folder_transformers_wrote_loads_and_agrees(tmp_path, byte_tok):
    """Qwen3 as transformers lays it out (its own config and save_pretrained): per-head q/k norm
    weights, biases on q/k/v/o (attention_bias), head_dim independent of hidden/heads."""
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=258, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True,
                         tie_word_embeddings=False, eos_token_id=257)
    hf = save_transformers_model(config, byte_tok, tmp_path)
    loaded = load_model(tmp_path)
    c = loaded.config
    assert (c.model_type, c.architecture, c.qk_norm, c.qkv_bias, c.o_bias, c.head_dim) == \
        ("qwen3", "Qwen3ForCausalLM", True, True, True, 24)
    ids = torch.tensor([5, 6, 7, 8, 9])
    ours = loaded.model.compute_logits(loaded.model(ids, FullCausalAttention(), AttentionMetadata.for_full_sequences([5])))
    torch.testing.assert_close(ours, hf(ids[None]).logits[0].detach(), atol=1e-5, rtol=1e-4)


def test_weights_corrupt_safetensors_says_how_to_fix(tmp_path, byte_tok):
    save_hf_folder(tiny_model("gqa_tied"), byte_tok, tmp_path)
    blob = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(blob[: len(blob) // 2])  # truncated download
    with pytest.raises(ModelLoadError, match=r"corrupt.*Delete it"):
        load_model(tmp_path)


def test_weights_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="No model at"):
        load_model(tmp_path / "nope" / "model")
    with pytest.raises(ModelLoadError, match="No such GGUF file"):
        load_model(tmp_path / "missing.gguf")


@pytest.mark.parametrize("content", [b"not a gguf at all", b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40])
def test_weights_corrupt_gguf_says_how_to_fix(tmp_path, monkeypatch, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    monkeypatch.setenv("COURSE_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"GGUF.*Delete it"):
        load_model(bad)
    cache = tmp_path / "cache"  # no half cache (the lock a conversion holds is not one)
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.endswith(".lock")]


def test_weights_default_model_env_pointing_nowhere(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODEL_CACHE", str(tmp_path))
    monkeypatch.setenv("COURSE_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="COURSE_SMOLLM2_GGUF.*does not exist"):
        load_model(None)


def test_weights_default_model_cache_is_configurable(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODEL_CACHE", str(tmp_path))
    assert default_model.default_model_dir() == tmp_path / "SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_weights_real_model_has_the_documented_shape(smollm2):
    c = smollm2.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (30, 576, 9, 3, 64)
    assert c.tie_word_embeddings and c.vocab_size == 49152 and c.rope_theta == 100000.0
    assert smollm2.eos_token_ids == [2]
    assert "<|im_start|>" in smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


def test_weights_first_use_converts_once_under_a_lock(tmp_path, monkeypatch):
    """Two processes starting at once on a fresh machine (two servers, two test workers) must not
    convert into the same folder together: the conversion runs holding the cache's lock, and a
    process that waited for the lock finds the folder made and converts nothing."""
    import fcntl

    monkeypatch.setenv("COURSE_MODEL_CACHE", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("COURSE_SMOLLM2_GGUF", str(gguf))
    out = default_model.default_model_dir()
    held, converted = [], []

    def fake_convert(src, dest):
        with open(tmp_path / f".{dest.name}.lock", "w") as probe:  # a second opener is shut out
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        dest.mkdir(parents=True)
        for name in default_model.REQUIRED_FILES:
            (dest / name).write_text("{}")
        converted.append(dest)

    monkeypatch.setattr(default_model, "convert_gguf", fake_convert)
    assert default_model.ensure_default_model() == out
    assert default_model.ensure_default_model() == out
    assert converted == [out] and held == [True]

    # the process that waited: the folder appeared while it queued for the lock
    other = tmp_path / "other"
    monkeypatch.setenv("COURSE_MODEL_CACHE", str(other))
    real_lock = default_model.cache_lock

    def lock_after_the_other_process(name):
        fake_convert(None, other / "SmolLM2-135M-Instruct")  # the other process, done first
        return real_lock(name)

    monkeypatch.setattr(default_model, "cache_lock", lock_after_the_other_process)
    converted.clear()
    default_model.ensure_default_model()
    assert converted == [other / "SmolLM2-135M-Instruct"]  # only the other process's conversion


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_weights_sliding_window_models_equal_transformers_past_the_window(tmp_path, byte_tok, family):
    """A Mistral config with `sliding_window` (every layer slides), and Qwen2 with use_sliding_window
    (the layers from max_window_layers on slide): loaded from a folder, our greedy tokens equal
    transformers' for prompts and generations well past the window."""
    from transformers import CONFIG_MAPPING

    from course.s01_decode_loop.generate import generate_naive
    from course.s01_decode_loop.sampling import SamplingParams
    from course.s01_decode_loop.testing import greedy_reference_uncached

    window = 6
    extra = {"use_sliding_window": True, "max_window_layers": 1} if family == "qwen2" else {}
    config = CONFIG_MAPPING[family](vocab_size=258, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                                    max_position_embeddings=512, eos_token_id=257, **extra)
    hf = save_transformers_model(config, byte_tok, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.layer_windows == ((window,) * 3 if family == "mistral" else (None, window, window))
    for prompt in ([5, 6, 7], list(range(5, 5 + 3 * window)), list(range(40, 40 + 5 * window + 1))):
        ours = generate_naive(loaded.model, byte_tok, prompt,
                              SamplingParams(max_new_tokens=2 * window, temperature=0.0, ignore_eos=True))
        assert ours.token_ids == greedy_reference_uncached(hf, prompt, 2 * window)
    # past the window, the windowed model and full attention really differ: the mask matters
    full = type(hf)(CONFIG_MAPPING[family](**{**config.to_dict(), "sliding_window": None,
                                              "use_sliding_window": False, "layer_types": None})).eval()
    full.load_state_dict(hf.state_dict())
    with torch.no_grad():
        ids = torch.tensor([list(range(5, 5 + 3 * window))])
        assert not torch.allclose(hf(ids).logits[0, -1], full(ids).logits[0, -1], atol=1e-4)
    # a backend not built for the windows is refused by name, never run as full attention
    meta = AttentionMetadata.for_full_sequences([4])
    with pytest.raises(ValueError, match="windows"):
        loaded.model(torch.tensor([5, 6, 7, 8]), FullCausalAttention(), meta)
    # a window no sequence can leave is full attention
    assert ModelConfig.from_hf({**config.to_dict(), "sliding_window": 512}).layer_windows == ()
