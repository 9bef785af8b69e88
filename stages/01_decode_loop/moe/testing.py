"""Tiny random-weight MoE models of each family, for tests in every stage. The tiny Mixtral is
one of stage 01's TINY_CONFIGS (so every stage's equivalence tests run it); the others differ
from it, or from the tiny Qwen3, only where their family does."""
from __future__ import annotations

from ..config import ModelConfig
from ..model import CausalLM, init_random_weights
from ..testing import TINY_CONFIGS, tiny_model

MOE_VARIANTS = {
    "qwen2_moe": ("mixtral_moe", {"model_type": "qwen2_moe", "qkv_bias": True, "num_hidden_layers": 3,
                                  "mlp_only_layers": [1], "norm_topk_prob": False,
                                  "shared_expert_intermediate_size": 24}),  # a shared expert, a dense layer
    "qwen3_moe": ("qwen3", {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                            "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 2}),
}
MOE_FAMILIES = ("mixtral", *MOE_VARIANTS)


def tiny_moe_model(family: str, seed: int = 0) -> CausalLM:
    if family == "mixtral":
        return tiny_model("mixtral_moe", seed)
    base, changes = MOE_VARIANTS[family]
    return init_random_weights(CausalLM(ModelConfig(**{**TINY_CONFIGS[base].to_dict(), **changes})), seed).eval()
