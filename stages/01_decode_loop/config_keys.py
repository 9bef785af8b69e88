"""Every key of a supported family's Hugging Face config, sorted into one of three kinds, so that
none which changes what the model computes is ever ignored in silence:

- READ: `ModelConfig.from_hf` (or `moe_fields`) turns it into a field;
- INERT: it cannot change the logits at inference;
- CHECKED: this engine does not implement it. The value that means "off" is accepted; any other
  is refused at load with a ValueError that names the key.

tests/test_config_keys.py walks transformers' own config class of each family and names any key
in none of the three, so a newer transformers that adds one gets sorted here before it is served.
"""
from __future__ import annotations

from typing import Any, Callable

CONFIG_FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")  # config.py's

READ = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
    "rope_parameters", "rope_scaling", "rope_theta",  # transformers 5 folds the last two into the first
    "attention_bias", "qkv_bias", "mlp_bias", "bos_token_id", "eos_token_id",
    "sliding_window", "use_sliding_window", "max_window_layers",  # config.read_layer_types (and layer_types, checked)
    "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",  # MoE: moe/config.py
    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size",
})

INERT = frozenset({
    # bookkeeping; the dtype the checkpoint was saved in (the engine is given its own)
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "is_encoder_decoder",
    # training only: weight init, dropout (off at inference), the router's loss and jitter noise
    "initializer_range", "attention_dropout", "router_aux_loss_coef", "router_jitter_noise", "output_router_logits",
    # what a forward returns, not what it computes; labels of classification heads
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward",  # runs the MLP over positions in chunks: the same numbers
    "pretraining_tp",  # how training split the matmuls across devices: the same product
    "pad_token_id",  # the embedding's padding row only matters to its gradient
})

# key -> (does this value leave the model as we implement it?, what serving any other value needs)
CHECKED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "hidden_act": (lambda v: v in ("silu", "swish"), "an MLP activation other than SiLU (we implement SwiGLU)"),
    "layer_types": (lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
                    "a kind of layer other than full or sliding-window attention (e.g. linear attention)"),
    "partial_rotary_factor": (lambda v: v is None or v == 1, "RoPE on only a fraction of each head's channels"),
}


def refuse_unimplemented(d: dict[str, Any]) -> None:
    """ValueError, naming the key, for a CHECKED key whose value this engine cannot serve.
    transformers 5 may also move a key (partial_rotary_factor) into the RoPE dict: look there too."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    for key, (leaves_model_as_is, needs) in CHECKED.items():
        for where in (d, rope):
            if key in where and not leaves_model_as_is(where[key]):
                raise ValueError(f"config key {key}={where[key]!r}: serving it needs {needs}, "
                                 "which this engine does not implement")


def with_family_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """A config.json with the keys it leaves out as transformers' class for its family fills them
    (its defaults, and what it derives: a missing num_key_value_heads is num_attention_heads):
    a missing rms_norm_eps is 1e-6 for Llama, a Mixtral's rope_theta 1e6, a Mistral's
    sliding_window 4096. Not ours (1e-5, 1e4, none): a model loaded here must compute what it
    computes there."""
    from transformers import AutoConfig

    if d.get("model_type") not in CONFIG_FAMILIES:
        return d  # from_hf refuses it by name
    filled = AutoConfig.for_model(**d).to_dict()
    return {**filled, **d}
