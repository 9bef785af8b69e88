"""gpt-oss (families/gpt_oss.py) computes what transformers' GptOssForCausalLM computes: its logits,
its greedy tokens, its YaRN frequencies; and it refuses what it does not implement, by name."""
import copy

import pytest
import torch
from transformers import GptOssConfig as HFGptOssConfig
from transformers import GptOssForCausalLM as HFGptOss
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention, causal_attention
from course.s01_decode_loop.families.gpt_oss import (MODEL_TYPE, GptOssConfig, GptOssForCausalLM,
                                                     GptOssRotaryEmbedding, tiny_config, yarn_inverse_frequencies)
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import byte_tokenizer, greedy_reference, torch_threads

ATOL = 1e-4  # float32 logits of size ~1-5: ours and transformers' differ by ~1e-6 (summation order)
WINDOW = 8   # tiny_config's sliding window: every prompt below is longer


@pytest.fixture(autouse=True)
def one_torch_thread():
    with torch_threads(1):  # tiny models: see torch_threads
        yield


def hf_gpt_oss(seed=0, **overrides):
    """A tiny random transformers gpt-oss. Its own init leaves expert and attention biases at zero
    and sinks near zero; here every one is random and large enough to matter."""
    torch.manual_seed(seed)
    hf = HFGptOss(tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.15)
    return hf


def ours_from(hf):
    model = GptOssForCausalLM(GptOssConfig.from_hf(hf.config)).eval()
    model.load_state_dict(hf.state_dict(), strict=True)  # transformers' names, all of them
    return model


def our_logits(model, prompts, attn=None):
    """Every row's logits of one flat forward over all `prompts`."""
    ids = torch.tensor([t for p in prompts for t in p])
    meta = AttentionMetadata.for_full_sequences([len(p) for p in prompts])
    with torch.no_grad():
        return model.compute_logits(model(ids, attn or FullCausalAttention(model.config.layer_windows), meta))


def hf_logits(hf, prompt):
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float()


PROMPTS = [list(b"gpt-oss slides its window"), list(b"and sinks.")]  # 25 and 10 tokens, both > WINDOW


@pytest.fixture(scope="module")
def pair():
    hf = hf_gpt_oss()
    return hf, ours_from(hf)


def test_family_gpt_oss_logits_equal_transformers_in_one_flat_batch(pair):
    hf, ours = pair
    assert all(len(p) > WINDOW for p in PROMPTS)
    got = our_logits(ours, PROMPTS)
    want = torch.cat([hf_logits(hf, p) for p in PROMPTS])
    assert want.abs().max() > 1.0  # logits big enough that an error shows
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_family_gpt_oss_greedy_tokens_equal_transformers(pair):
    hf, ours = pair
    ids = byte_tokenizer()("the window is eight tokens wide").input_ids
    assert len(ids) > WINDOW
    out = generate_naive(ours, byte_tokenizer(), ids, SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                     ignore_eos=True))
    assert out.token_ids == greedy_reference(hf, ids, 12)[0]


@pytest.mark.parametrize("change", ["no sinks", "no window", "no clamp", "no yarn"])
def test_family_gpt_oss_each_feature_changes_transformers_logits(pair, change):
    """Sinks, the window, the SwiGLU clamp and YaRN each move transformers' logits, so the equality
    above would catch us leaving one out."""
    hf, _ = pair
    if change == "no sinks":
        other = copy.deepcopy(hf)
        with torch.no_grad():
            for layer in other.model.layers:
                layer.self_attn.sinks.fill_(-1e4)  # a sink logit that takes no weight: as if absent
    else:
        overrides = {"no window": dict(layer_types=["full_attention"] * 4),
                     "no clamp": dict(swiglu_limit=1e4),
                     "no yarn": dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0))}[change]
        other = HFGptOss(tiny_config(**overrides)).eval()
        other.load_state_dict(hf.state_dict())
    assert (hf_logits(hf, PROMPTS[0]) - hf_logits(other, PROMPTS[0])).abs().max() > 100 * ATOL


def test_family_gpt_oss_sink_softmax_equals_transformers_eager():
    """transformers appends the sink logit, subtracts the row max, softmaxes, drops the sink column;
    causal_attention appends it and softmaxes: the max shift cancels, the same weights."""
    torch.manual_seed(1)
    t, h, hkv, d = 11, 4, 2, 16
    q, k, v = torch.randn(t, h, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    sinks = 2 * torch.randn(h)
    module = torch.nn.Module()
    module.num_key_value_groups, module.sinks, module.training = h // hkv, sinks, False
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    want, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      v.transpose(0, 1)[None], mask, scaling=d ** -0.5)
    torch.testing.assert_close(causal_attention(q, k, v, 0, sinks=sinks), want[0], atol=1e-6, rtol=0)


def test_family_gpt_oss_refuses_backends_that_would_drop_sinks_or_windows(pair):
    _, ours = pair

    class NoSinksAttention(FullCausalAttention):
        takes_sinks = False

    with pytest.raises(ValueError, match="NoSinksAttention does not take them"):
        our_logits(ours, PROMPTS, NoSinksAttention(ours.config.layer_windows))
    with pytest.raises(ValueError, match="slide over windows"):
        our_logits(ours, PROMPTS, FullCausalAttention(()))


YARN_CASES = [
    dict(head_dim=64, rope_theta=150000.0, max_position_embeddings=131072,  # gpt-oss-20b/120b's own
         rope=dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)),
    dict(head_dim=64, rope_theta=150000.0, max_position_embeddings=131072,
         rope=dict(factor=32.0, original_max_position_embeddings=4096)),  # truncate (default on), default betas
    dict(head_dim=128, rope_theta=1e6, max_position_embeddings=32768,
         rope=dict(factor=4.0, beta_fast=16.0, beta_slow=2.0, mscale=0.707, mscale_all_dim=1.0,
                   original_max_position_embeddings=8192)),
    dict(head_dim=16, rope_theta=10000.0, max_position_embeddings=512,
         rope=dict(factor=32.0, attention_factor=1.5, truncate=False, original_max_position_embeddings=16)),
]


@pytest.mark.parametrize("case", YARN_CASES, ids=range(len(YARN_CASES)))
def test_family_gpt_oss_yarn_equals_transformers(case):
    rope = dict(rope_type="yarn", rope_theta=case["rope_theta"], **case["rope"])
    hf_config = HFGptOssConfig(head_dim=case["head_dim"], max_position_embeddings=case["max_position_embeddings"],
                               num_hidden_layers=2, rope_parameters=rope)
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    freq, factor = yarn_inverse_frequencies(case["head_dim"], case["rope_theta"], case["rope"],
                                            case["max_position_embeddings"])
    torch.testing.assert_close(freq, want_freq, atol=0, rtol=1e-6)
    assert factor == pytest.approx(want_factor, rel=1e-12)
    # and through the config, as the model uses it: cos/sin at far positions, the factor applied
    rotary = GptOssRotaryEmbedding(GptOssConfig.from_hf(hf_config))
    positions = torch.tensor([0, 1, 7, 4095, 100_000])
    cos, sin = rotary(positions)
    angles = positions.float()[:, None] * want_freq
    torch.testing.assert_close(cos, angles.cos() * want_factor, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, angles.sin() * want_factor, atol=1e-6, rtol=0)


# openai/gpt-oss-20b's config.json, its MXFP4 quantization_config left out (refused below)
RELEASED_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False,
    "pad_token_id": 199999, "rms_norm_eps": 1e-05, "rope_theta": 150000, "router_aux_loss_coef": 0.9,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088,
}


def test_family_gpt_oss_config_round_trips_through_transformers():
    config = GptOssConfig.from_hf(tiny_config())
    assert config.architecture == "GptOssForCausalLM" and config.model_type == MODEL_TYPE
    assert config.layer_windows == (WINDOW, None, WINDOW, None)
    assert GptOssConfig.from_hf(HFGptOssConfig(**config.to_hf())) == config
    # every key transformers' class writes, and every key of the released config.json, is placed
    assert GptOssConfig.from_hf(HFGptOssConfig()).num_experts == 128
    released = GptOssConfig.from_hf(RELEASED_20B)
    assert released == GptOssConfig.from_hf(HFGptOssConfig(**RELEASED_20B))
    assert released.rope_yarn["factor"] == 32.0 and released.layer_windows[:2] == (128, None)


@pytest.mark.parametrize("key, value", [
    ("quantization_config", {"quant_method": "mxfp4"}),
    ("partial_rotary_factor", 0.5),
    ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    ("rope_parameters", {"rope_type": "yarn", "factor": 2.0, "long_factor": [1.0], "rope_theta": 10000.0}),
    ("some_new_switch", True),
])
def test_family_gpt_oss_refuses_unimplemented_config_keys_by_name(key, value):
    d = {**tiny_config().to_dict(), key: value}
    with pytest.raises(ValueError, match=key):
        GptOssConfig.from_hf(d)
