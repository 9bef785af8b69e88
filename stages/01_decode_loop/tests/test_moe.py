"""Mixture-of-Experts (moe/): the router and the experts compute what transformers' Mixtral
computes, and both checkpoint layouts load to the same weights."""
import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.moe.checkpoint import stack_experts
from course.s01_decode_loop.moe.experts import Experts, SparseMoeBlock, naive_experts
from course.s01_decode_loop.moe.grouped import grouped_experts
from course.s01_decode_loop.moe.router import route
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import greedy_reference
from course.s01_decode_loop.weights import build_model, load_model


def hf_mixtral(seed=0, **overrides):
    """A tiny random transformers Mixtral (no download): 4 experts, top-2, 2 layers."""
    torch.manual_seed(seed)
    config = MixtralConfig(**{**dict(vocab_size=258, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_local_experts=4, num_experts_per_tok=2, bos_token_id=256,
                                     eos_token_id=257, max_position_embeddings=256), **overrides})
    hf = MixtralForCausalLM(config).eval()
    with torch.no_grad():  # transformers' init leaves the stacked experts near zero: make them count
        for name, p in hf.named_parameters():
            if "experts" in name or "mlp.gate" in name:
                p.normal_(0.0, 0.2)
    return hf


def test_moe_config_reads_mixtral():
    cfg = ModelConfig.from_hf(hf_mixtral().config)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 48)
    assert cfg.norm_topk_prob and all(cfg.is_moe_layer(i) for i in range(2))


def test_moe_config_sparse_step_and_dense_layers():
    cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=6, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=4, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=4, decoder_sparse_step=2, mlp_only_layers=[3])
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_router_topk_renormalisation(renormalize):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = route(logits, 2, renormalize)
    probs = torch.softmax(logits, -1)[0]
    assert ids.tolist() == [[0, 1]]
    expected = probs[:2] / probs[:2].sum() if renormalize else probs[:2]
    torch.testing.assert_close(weights[0], expected)
    assert torch.isclose(weights.sum(), torch.tensor(1.0)) == renormalize


def test_moe_router_ties_pick_what_transformers_picks():
    hf = hf_mixtral()
    router = hf.model.layers[0].mlp.gate
    x = torch.randn(5, 64)
    with torch.no_grad():
        router.weight.zero_()                 # every expert equally likely
        router.weight[2] = router.weight[3] = 0.5  # and experts 2 and 3 tied at the top for some rows
        _, hf_weights, hf_ids = router(x)
        ours_w, ours_ids = route(x @ router.weight.T, 2, True)
    assert ours_ids.tolist() == hf_ids.tolist()
    torch.testing.assert_close(ours_w, hf_weights)


def test_moe_layer_equals_transformers_block():
    hf = hf_mixtral()
    ours = SparseMoeBlock(ModelConfig.from_hf(hf.config))
    ours.load_state_dict(hf.model.layers[0].mlp.state_dict())
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x[0]), hf.model.layers[0].mlp(x)[0], atol=1e-6, rtol=1e-5)


def test_moe_both_checkpoint_layouts_load_the_same_weights(tmp_path):
    hf = hf_mixtral()
    hf.save_pretrained(tmp_path)  # transformers writes one tensor per expert (block_sparse_moe.experts.N.w1)
    from safetensors.torch import load_file
    on_disk = load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in on_disk
    config = ModelConfig.from_hf(hf.config)
    per_expert, stacked = build_model(config, dict(on_disk)), build_model(config, hf.state_dict())
    for (name, a), (_, b) in zip(per_expert.state_dict().items(), stacked.state_dict().items()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    qwen_style = {k.replace("block_sparse_moe", "mlp").replace("w1", "gate_proj").replace("w3", "up_proj")
                  .replace("w2", "down_proj"): v for k, v in on_disk.items()}
    torch.testing.assert_close(stack_experts(qwen_style)["model.layers.1.mlp.experts.gate_up_proj"],
                               hf.state_dict()["model.layers.1.mlp.experts.gate_up_proj"])


def test_moe_mixtral_folder_greedy_equals_transformers_generate(tmp_path, byte_tok):
    hf = hf_mixtral(seed=3)
    hf.save_pretrained(tmp_path)
    byte_tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    for prompt in ["Hello", "The quick brown fox jumps over"]:
        ids = byte_tok(prompt).input_ids
        ours = generate_naive(loaded.model, byte_tok, ids, SamplingParams(max_new_tokens=24, temperature=0,
                                                                          ignore_eos=True))
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                          pad_token_id=0)[0, len(ids):].tolist()
        assert ours.token_ids == ref


def test_moe_qwen2_moe_shared_expert_greedy_equals_transformers(tmp_path, byte_tok):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(1)
    hf = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=258, hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[1], bos_token_id=256,
        eos_token_id=257, max_position_embeddings=256)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "experts" in name or "mlp.gate" in name or "shared_expert" in name or "bias" in name:
                p.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path)
    byte_tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert not loaded.config.is_moe_layer(1) and loaded.config.qkv_bias and not loaded.config.norm_topk_prob
    ids = byte_tok("The quick brown fox").input_ids
    ours = generate_naive(loaded.model, byte_tok, ids, SamplingParams(max_new_tokens=24, temperature=0,
                                                                      ignore_eos=True))
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                      pad_token_id=0)[0, len(ids):].tolist()
    assert ours.token_ids == ref


def hf_qwen3_moe(seed=0, **overrides):
    """A tiny random transformers Qwen3-MoE: q/k norm, 6 experts top-2 renormalised, layer 0 dense."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**{**dict(vocab_size=258, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=6,
                                      num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
                                      mlp_only_layers=[0], bos_token_id=256, eos_token_id=257,
                                      max_position_embeddings=256), **overrides})
    hf = Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "experts" in name or "mlp.gate" in name or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    return hf


def test_moe_qwen3_moe_folder_greedy_equals_transformers(tmp_path, byte_tok):
    hf = hf_qwen3_moe()
    hf.save_pretrained(tmp_path)  # per-expert tensors: mlp.experts.N.gate_proj
    byte_tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    c = loaded.config
    assert (c.architecture, c.qk_norm, c.num_experts, c.norm_topk_prob) == ("Qwen3MoeForCausalLM", True, 6, True)
    assert [c.is_moe_layer(i) for i in range(3)] == [False, True, True]
    for prompt in ["Hello", "The quick brown fox jumps over"]:
        ids = byte_tok(prompt).input_ids
        ours = generate_naive(loaded.model, byte_tok, ids, SamplingParams(max_new_tokens=24, temperature=0,
                                                                          ignore_eos=True))
        assert ours.token_ids == greedy_reference(hf, ids, 24)[0]


def test_moe_router_without_renormalisation_equals_qwen3_moe():
    hf = hf_qwen3_moe(norm_topk_prob=False)
    router = hf.model.layers[1].mlp.gate
    x = torch.randn(7, 48)
    with torch.no_grad():
        _, hf_weights, hf_ids = router(x)
        ours_w, ours_ids = route(x @ router.weight.T, 2, renormalize=False)
    assert ours_ids.tolist() == hf_ids.tolist() and ours_w.sum(-1).max() < 1
    torch.testing.assert_close(ours_w, hf_weights)


def random_experts(num_experts=8, hidden=48, inter=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    experts = Experts(num_experts, hidden, inter)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return experts


@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_moe_grouped_equals_naive_loop(rows, top_k):
    experts = random_experts()
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=g)
    weights, ids = route(torch.randn(rows, 8, generator=g), top_k, renormalize=top_k > 1)
    with torch.no_grad():
        torch.testing.assert_close(grouped_experts(experts, x, weights, ids), naive_experts(experts, x, weights, ids),
                                   atol=1e-5, rtol=1e-5)
