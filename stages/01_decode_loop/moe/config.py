"""The Mixture-of-Experts fields of a Hugging Face config, read and written (config.py's)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class MoeFields:
    """ModelConfig's Mixture-of-Experts fields: 0 experts = every layer a dense MLP."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0   # each expert's SwiGLU width
    norm_topk_prob: bool = True      # renormalise the chosen experts' weights to sum to 1
    decoder_sparse_step: int = 1     # every step-th layer is MoE ...
    mlp_only_layers: list[int] = field(default_factory=list)  # ... except these, dense
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one more expert every token goes through

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

def moe_fields(d: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's MoE fields from a HF config dict (none for a dense model). Mixtral's
    experts are `intermediate_size` wide and always renormalised; Qwen-MoE configs say both."""
    experts = d.get("num_local_experts") or d.get("num_experts") or 0
    if not experts:
        return {}
    mixtral = d.get("model_type") == "mixtral"
    return dict(num_experts=experts, num_experts_per_tok=d["num_experts_per_tok"],
                moe_intermediate_size=d["intermediate_size"] if mixtral else d["moe_intermediate_size"],
                norm_topk_prob=True if mixtral else bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=d.get("decoder_sparse_step") or 1,
                mlp_only_layers=list(d.get("mlp_only_layers") or []),
                shared_expert_intermediate_size=d.get("shared_expert_intermediate_size") or 0)


def moe_hf_fields(c) -> dict[str, Any]:
    """The HF config entries of a ModelConfig's MoE fields (none for a dense model)."""
    if not c.num_experts:
        return {}
    d = dict(num_experts_per_tok=c.num_experts_per_tok,
             num_local_experts=c.num_experts, num_experts=c.num_experts, moe_intermediate_size=c.moe_intermediate_size,
             norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=c.decoder_sparse_step,
             mlp_only_layers=c.mlp_only_layers, shared_expert_intermediate_size=c.shared_expert_intermediate_size,
             qkv_bias=c.qkv_bias)
    if c.model_type == "mixtral":  # its experts are intermediate_size wide
        d["intermediate_size"] = c.moe_intermediate_size
    return d
