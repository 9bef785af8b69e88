"""Gemma 3 (text) written from scratch (families/gemma3.py) computes what transformers'
Gemma3ForCausalLM computes, on tiny random models made by transformers itself."""
import dataclasses
from functools import cache

import pytest
import torch
from transformers import AutoConfig, Gemma3TextConfig
from transformers import Gemma3ForCausalLM as HfGemma3

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.families.gemma3 import (CHECKED, INERT, MODEL_TYPE, READ, Gemma3Config,
                                                    Gemma3ForCausalLM, tiny_config)
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import byte_tokenizer, greedy_reference

ATOL = RTOL = 1e-4  # float32 on both sides; the logits are O(1) and differ by under 1e-5 in practice
WINDOW = 8  # tiny_config's sliding window: every prompt below is longer

VARIANTS = {
    "five_local_one_global": {},  # Gemma 3's own pattern, tied embeddings, tanh-GeLU, plain RoPE
    "mixed": dict(  # a short explicit pattern, and every option that the first leaves off
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        tie_word_embeddings=False, hidden_activation="gelu", final_logit_softcapping=2.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}}),
}


def random_hf_model(hf_config: Gemma3TextConfig, seed: int = 0) -> HfGemma3:
    """transformers' model with its own random init, plus noise on what that init leaves constant
    (norm weights at 0, biases at 0), so a norm or bias we skip or misread shows in the logits."""
    torch.manual_seed(seed)
    hf = HfGemma3(hf_config).to(torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return hf


def ours_from(hf: HfGemma3) -> Gemma3ForCausalLM:
    model = Gemma3ForCausalLM(Gemma3Config.from_hf(hf.config)).eval()
    model.load_state_dict(hf.state_dict(), strict=True)  # same names, nothing missing or left over
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == hf.config.tie_word_embeddings
    return model


@cache
def twins(variant: str) -> tuple[Gemma3ForCausalLM, HfGemma3]:
    hf = random_hf_model(tiny_config(**VARIANTS[variant]))
    return ours_from(hf), hf


@torch.no_grad()
def our_logits(model, seqs, windows=None):
    """All sequences in ONE flat forward pass; returns each one's logits."""
    ids = torch.tensor([t for s in seqs for t in s])
    meta = AttentionMetadata.for_full_sequences([len(s) for s in seqs])
    attn = FullCausalAttention(model.config.layer_windows if windows is None else windows)
    return model.compute_logits(model(ids, attn, meta)).split([len(s) for s in seqs])


@torch.no_grad()
def hf_logits(hf, seq):
    return hf(torch.tensor([seq])).logits[0].float()


def random_seqs(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 258, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("variant", VARIANTS)
def test_family_gemma3_logits_match_transformers(variant):
    model, hf = twins(variant)
    singles = random_seqs([1, WINDOW + 1, 40, 100])
    pair = random_seqs([23, 61], seed=2)  # two lengths in one flat batch: windows stay per sequence
    for batch in [[s] for s in singles] + [pair]:
        for ours, seq in zip(our_logits(model, batch), batch):
            torch.testing.assert_close(ours, hf_logits(hf, seq), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_family_gemma3_greedy_matches_transformers_generate(variant):
    model, hf = twins(variant)
    tok = byte_tokenizer()
    for prompt in ["The quick brown fox jumps over the lazy dog", "Hello, Gemma!"]:
        ids = tok(prompt).input_ids
        assert len(ids) > WINDOW
        ours = generate_naive(model, tok, ids, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
        ref, _ = greedy_reference(hf, ids, 16)
        assert ours.token_ids == ref, prompt


def test_family_gemma3_the_window_matters():
    """Widened to cover every position, the same weights answer differently in transformers too,
    so the tests above would fail if we let the local layers see too much; and ours follows it."""
    model, hf = twins("five_local_one_global")
    wide = random_hf_model(tiny_config(sliding_window=512))
    wide.load_state_dict(hf.state_dict())
    (seq,) = random_seqs([60], seed=3)
    narrow_ref, wide_ref = hf_logits(hf, seq), hf_logits(wide, seq)
    assert (narrow_ref[WINDOW:] - wide_ref[WINDOW:]).abs().max() > 1e-2
    torch.testing.assert_close(narrow_ref[:WINDOW], wide_ref[:WINDOW], atol=ATOL, rtol=RTOL)  # same until it slides
    (ours_wide,) = our_logits(ours_from(wide), [seq])
    torch.testing.assert_close(ours_wide, wide_ref, atol=ATOL, rtol=RTOL)


def test_family_gemma3_a_backend_without_the_windows_is_refused():
    model, _ = twins("five_local_one_global")
    assert model.config.layer_windows == (WINDOW,) * 5 + (None,)
    for wrong in [(), (WINDOW,) * 6]:
        with pytest.raises(ValueError, match="windows"):
            our_logits(model, random_seqs([12]), windows=wrong)


def hf_dict(**changes) -> dict:
    return {**tiny_config().to_dict(), **changes}


def rope(full=None, local=None) -> dict:
    return {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6, **(full or {})},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, **(local or {})}}}


@pytest.mark.parametrize("key, refused, accepted", [
    ("attn_logit_softcapping", dict(attn_logit_softcapping=50.0), dict(attn_logit_softcapping=None)),
    ("hidden_activation", dict(hidden_activation="relu"), dict(hidden_activation="gelu_pytorch_tanh")),
    ("use_bidirectional_attention", dict(use_bidirectional_attention=True), dict(use_bidirectional_attention=False)),
    ("full_attention", rope(full={"rope_type": "yarn", "factor": 8.0}), rope(full={"rope_type": "linear",
                                                                                  "factor": 8.0})),
    ("sliding_attention", rope(local={"rope_type": "linear", "factor": 2.0}), rope()),
    ("partial_rotary_factor", rope(full={"partial_rotary_factor": 0.5}), rope(full={"partial_rotary_factor": 1.0})),
    ("gemma2", dict(model_type="gemma2"), dict(model_type=MODEL_TYPE)),
])
def test_family_gemma3_an_unimplemented_config_value_is_refused_by_name(key, refused, accepted):
    with pytest.raises(ValueError, match=key):
        Gemma3Config.from_hf(hf_dict(**refused))
    Gemma3Config.from_hf(hf_dict(**accepted))  # the value that leaves the model as implemented loads


def test_family_gemma3_every_config_key_is_read_inert_or_checked():
    assert not (READ & INERT) and not (READ & set(CHECKED)) and not (INERT & set(CHECKED))
    keys = set(Gemma3TextConfig().to_dict()) | {f.name for f in dataclasses.fields(Gemma3TextConfig)}
    assert not (keys - READ - INERT - set(CHECKED)), "sort each new key of transformers' class in gemma3.py"


def test_family_gemma3_config_round_trips_and_reads_older_config_json():
    config = Gemma3Config.from_hf(tiny_config(**VARIANTS["mixed"]))
    assert config.model_type == MODEL_TYPE and config.architecture == "Gemma3ForCausalLM"
    assert Gemma3Config.from_hf(config.to_hf()) == config
    assert Gemma3Config.from_hf(AutoConfig.for_model(**config.to_hf())) == config
    # before transformers 5: flat RoPE keys and a sliding_window_pattern instead of layer_types
    older = {k: v for k, v in hf_dict().items() if k not in ("rope_parameters", "layer_types")}
    older |= dict(rope_theta=5e5, rope_local_base_freq=2e4, sliding_window_pattern=3,
                  rope_scaling={"rope_type": "linear", "factor": 8.0})
    ours = Gemma3Config.from_hf(older)
    assert ours == Gemma3Config.from_hf(Gemma3TextConfig(**older))  # as transformers reads it
    assert (ours.rope_theta, ours.rope_local_base_freq, ours.rope_scaling) == (5e5, 2e4, {"rope_type": "linear",
                                                                                          "factor": 8.0})
    assert ours.layer_windows == (WINDOW, WINDOW, None) * 2
