"""Qwen3-Next (families/qwen3_next.py, families/delta_rule.py): the chunked delta rule equals its
token-by-token recurrence and carries its state from call to call (what a later stage's state
cache relies on), and the model computes what transformers' Qwen3NextForCausalLM computes."""
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3NextConfig as HFQwen3NextConfig
from transformers import Qwen3NextForCausalLM as HFQwen3NextForCausalLM
from transformers.models.qwen3_next.modeling_qwen3_next import (torch_chunk_gated_delta_rule,
                                                                torch_recurrent_gated_delta_rule)

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.families.delta_rule import (causal_conv1d, chunk_gated_delta_rule,
                                                        recurrent_gated_delta_rule)
from course.s01_decode_loop.families.qwen3_next import (MODEL_TYPE, Qwen3NextConfig, Qwen3NextForCausalLM,
                                                        tiny_config)
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import greedy_reference

RULE_ATOL = 1e-5                  # float32; the rule's outputs are of order 1-10
LOGITS_ATOL = LOGITS_RTOL = 1e-4  # float32, whole model against transformers
LIN, FULL = "linear_attention", "full_attention"
VARIANTS = {
    "default": {},  # 3 DeltaNet layers, then full attention; every layer MoE with a shared expert
    # full attention first, a dense layer, unrenormalised top-k, tied embeddings, biases, linear-scaled RoPE
    # on half of each head, one value head per key head, value heads wider than keys, a 3-tap conv
    "mixed": dict(layer_types=[FULL, LIN, LIN, FULL], mlp_only_layers=[1], norm_topk_prob=False,
                  tie_word_embeddings=True, attention_bias=True, rope_parameters=dict(
                      rope_type="linear", factor=2.0, rope_theta=1e6, partial_rotary_factor=0.5),
                  linear_num_value_heads=2, linear_value_head_dim=24, linear_conv_kernel_dim=3),
}


def rule_inputs(t, heads=3, dk=8, dv=12, seed=0):
    """Random q, k, v, g, beta of one sequence, as the model feeds them: unit keys, queries scaled
    by dk^-0.5, decays g <= 0 mild enough that the state remembers across chunks, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    return dict(q=r(t, heads, dk) * dk ** -0.5, k=F.normalize(r(t, heads, dk), dim=-1), v=r(t, heads, dv),
                g=-0.3 * F.softplus(r(t, heads)), beta=torch.sigmoid(r(t, heads)))


def part(x, s):
    return {name: val[s] for name, val in x.items()}


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("t", [1, 5, 64, 100])
def test_family_qwen3_next_chunked_delta_rule_equals_recurrence(t, chunk_size, with_state):
    x = rule_inputs(t)
    state = torch.randn(3, 8, 12) if with_state else None
    out, final = recurrent_gated_delta_rule(**x, initial_state=state)
    chunk_out, chunk_final = chunk_gated_delta_rule(**x, chunk_size=chunk_size, initial_state=state)
    torch.testing.assert_close(chunk_out, out, atol=RULE_ATOL, rtol=RULE_ATOL)
    torch.testing.assert_close(chunk_final, final, atol=RULE_ATOL, rtol=RULE_ATOL)


@pytest.mark.parametrize("split", [1, 16, 23, 39])
def test_family_qwen3_next_delta_rule_state_carries_across_calls(split):
    """A prefill of `split` tokens (chunked), then the rest one token per call (recurrent), each
    call starting from the state the one before returned: the same as one call over everything."""
    x, chunks = rule_inputs(40), dict(chunk_size=16)
    whole, whole_state = chunk_gated_delta_rule(**x, **chunks)
    head, state = chunk_gated_delta_rule(**part(x, slice(0, split)), **chunks)
    tail, tail_state = chunk_gated_delta_rule(**part(x, slice(split, None)), **chunks, initial_state=state)
    torch.testing.assert_close(torch.cat([head, tail]), whole, atol=RULE_ATOL, rtol=RULE_ATOL)
    torch.testing.assert_close(tail_state, whole_state, atol=RULE_ATOL, rtol=RULE_ATOL)
    steps = []
    for t in range(split, 40):  # decode steps
        out, state = recurrent_gated_delta_rule(**part(x, slice(t, t + 1)), initial_state=state)
        steps.append(out)
    torch.testing.assert_close(torch.cat([head, *steps]), whole, atol=RULE_ATOL, rtol=RULE_ATOL)
    torch.testing.assert_close(state, whole_state, atol=RULE_ATOL, rtol=RULE_ATOL)


@pytest.mark.parametrize("reference", [torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule])
def test_family_qwen3_next_delta_rule_equals_transformers(reference):
    x, state = rule_inputs(100), torch.randn(3, 8, 12)
    ours, ours_state = chunk_gated_delta_rule(**x, initial_state=state)
    # transformers' takes a batch dimension and scales the queries itself
    ref, ref_state = reference(x["q"][None] * 8 ** 0.5, x["k"][None], x["v"][None], x["g"][None],
                               x["beta"][None], initial_state=state[None], output_final_state=True)
    torch.testing.assert_close(ours, ref[0], atol=RULE_ATOL, rtol=RULE_ATOL)
    torch.testing.assert_close(ours_state, ref_state[0], atol=RULE_ATOL, rtol=RULE_ATOL)


@pytest.mark.parametrize("split", [1, 2, 3, 20])
def test_family_qwen3_next_conv1d_state_carries_across_calls(split):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 5, generator=gen), torch.randn(5, 4, generator=gen)
    whole, whole_state = causal_conv1d(x, w)
    ref = F.conv1d(x.T[None], w[:, None], padding=3, groups=5)[0, :, :24].T  # zero-padded on the left
    torch.testing.assert_close(whole, ref, atol=RULE_ATOL, rtol=RULE_ATOL)
    assert torch.equal(whole_state, x[-3:])  # the state: the last kernel - 1 inputs
    first, state = causal_conv1d(x[:split], w)
    rest = []
    for t in range(split, 24):  # then one token per call, as decode steps
        y, state = causal_conv1d(x[t: t + 1], w, state)
        rest.append(y)
    torch.testing.assert_close(torch.cat([first, *rest]), whole, atol=RULE_ATOL, rtol=RULE_ATOL)
    assert torch.equal(state, whole_state)


def randomised_hf_model(config, seed=0):
    """A seeded transformers Qwen3NextForCausalLM whose every weight matters: norms off their
    init (zero-centred ones off 0, the gated one off 1), O(1) activations (so gates and routers
    are not all near 0.5), and slow decays (so the DeltaNet state carries across chunks)."""
    torch.manual_seed(seed)
    hf = HFQwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.05, 1.0).log())
            elif name.endswith("dt_bias"):
                p.add_(0.3 * torch.randn_like(p))
            elif "embed" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.5 / math.sqrt(p.shape[-1]))
    return hf


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def twins(request):
    """(transformers' model, ours holding its state dict) for each config variant."""
    hf = randomised_hf_model(tiny_config(**VARIANTS[request.param]))
    ours = Qwen3NextForCausalLM(Qwen3NextConfig.from_hf(hf.config)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


@torch.no_grad()
def test_family_qwen3_next_logits_equal_transformers_flat_batch(twins):
    hf, ours = twins
    lengths = [41, 97]  # one sequence inside a chunk, one across a chunk boundary, in one flat forward
    ids = torch.randint(0, 256, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    ours.tap_layers = (1,)
    logits = ours.compute_logits(ours(ids, FullCausalAttention(), AttentionMetadata.for_full_sequences(lengths)))
    tapped, ours.tap_layers = ours.tapped, ()
    start = 0
    for n in lengths:
        ref = hf(ids[None, start: start + n], use_cache=False, output_hidden_states=True)
        torch.testing.assert_close(logits[start: start + n], ref.logits[0], atol=LOGITS_ATOL, rtol=LOGITS_RTOL)
        torch.testing.assert_close(tapped[start: start + n], ref.hidden_states[2][0], atol=LOGITS_ATOL,
                                   rtol=LOGITS_RTOL)  # layer 1's output, as an EAGLE-3 drafter reads it
        start += n


def test_family_qwen3_next_greedy_equals_transformers_generate(twins, byte_tok):
    hf, ours = twins
    ids = byte_tok("Linear attention keeps a state, not a cache: ").input_ids
    out = generate_naive(ours, byte_tok, ids, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
    assert out.token_ids == greedy_reference(hf, ids, 16)[0]


class NoCheckAttention(AttentionBackend):
    """A backend that would take any rows: attention output zero."""

    def forward(self, layer, q, k, v, meta):
        return torch.zeros_like(q)


def test_family_qwen3_next_refuses_partial_sequences_and_windows(twins):
    _, ours = twins
    ids = torch.arange(5)
    tail = AttentionMetadata(positions=torch.arange(5, 10), cu_seqlens_q=torch.tensor([0, 5]),
                             seq_lens=torch.tensor([10]))  # the last 5 tokens of a 10-token sequence
    with pytest.raises(ValueError, match="linear-attention layer needs whole sequences"):
        ours(ids, NoCheckAttention(), tail)
    with pytest.raises(ValueError, match="windows"):
        ours(ids, FullCausalAttention(windows=(8, None, None, None)), AttentionMetadata.for_full_sequences([5]))


def test_family_qwen3_next_config_reads_and_writes_transformers_config():
    cfg = Qwen3NextConfig.from_hf(tiny_config())
    assert cfg.mixer_types == [LIN, LIN, LIN, FULL] and cfg.layer_types is None and cfg.layer_windows == ()
    assert (cfg.rotary_dim, cfg.num_experts, cfg.norm_topk_prob) == (4, 4, True)
    assert cfg.architecture == "Qwen3NextForCausalLM"
    assert Qwen3NextConfig.from_hf(HFQwen3NextConfig(**cfg.to_hf())) == cfg
    # a config.json that leaves keys out gets transformers' defaults, old-style rope keys included
    assert Qwen3NextConfig.from_hf({"model_type": MODEL_TYPE}) == Qwen3NextConfig.from_hf(HFQwen3NextConfig())
    old = dict(num_hidden_layers=8, rope_theta=1e6, partial_rotary_factor=0.5, full_attention_interval=2)
    assert Qwen3NextConfig.from_hf({"model_type": MODEL_TYPE, **old}) == Qwen3NextConfig.from_hf(
        HFQwen3NextConfig(**old))


@pytest.mark.parametrize("key,value", [
    ("hidden_act", "gelu"),
    ("layer_types", [LIN, "sliding_attention", LIN, FULL]),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}),
    ("a_future_switch", True),
])
def test_family_qwen3_next_refuses_unimplemented_key_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        Qwen3NextConfig.from_hf({**tiny_config().to_dict(), key: value})
    with pytest.raises(ValueError, match="model_type"):
        Qwen3NextConfig.from_hf({**tiny_config().to_dict(), "model_type": "qwen3_moe"})
