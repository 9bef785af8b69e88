"""Tiny random-weight models of the same architecture, for fast tests in every stage.

Each config exercises something the real model would not: grouped-query and multi-query
attention, odd head counts, untied lm_head, Qwen2-style q/k/v biases, Llama-3 RoPE scaling,
a head_dim that is not hidden/heads, Qwen3's per-head q/k norm, Mixture-of-Experts layers (4
experts, top-2). Weights are seeded, so every run sees the same model.
"""
from __future__ import annotations

import contextlib

import torch

from .config import ModelConfig
from .model import CausalLM, init_random_weights

BYTE_VOCAB = 256 + 2  # every byte, plus <s> and </s>
TINY_EOS = 257

_BASE = dict(vocab_size=BYTE_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
             rope_theta=10000.0, max_position_embeddings=512, bos_token_id=256, eos_token_ids=[TINY_EOS])

TINY_CONFIGS: dict[str, ModelConfig] = {
    "gqa_tied": ModelConfig(**{**_BASE, "tie_word_embeddings": True}),
    "mha_untied": ModelConfig(**{**_BASE, "num_key_value_heads": 4}),
    "mqa_odd_heads": ModelConfig(**{**_BASE, "hidden_size": 48, "num_attention_heads": 3,
                                    "num_key_value_heads": 1, "num_hidden_layers": 3}),
    "qwen2_bias": ModelConfig(**{**_BASE, "hidden_size": 72, "num_attention_heads": 6, "num_key_value_heads": 2,
                                 "head_dim": 12, "qkv_bias": True, "model_type": "qwen2",
                                 "rope_theta": 1_000_000.0}),
    "llama3_rope": ModelConfig(**{**_BASE, "head_dim": 32, "tie_word_embeddings": True,
                                  "rope_theta": 500000.0, "max_position_embeddings": 4096,
                                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}}),
    "qwen3": ModelConfig(**{**_BASE, "hidden_size": 48, "head_dim": 32, "qk_norm": True,
                            "model_type": "qwen3", "rope_theta": 1_000_000.0}),  # heads x head_dim = 128 > 48
    "mixtral_moe": ModelConfig(**{**_BASE, "model_type": "mixtral", "num_experts": 4, "num_experts_per_tok": 2,
                                  "moe_intermediate_size": 32}),
}


def tiny_model(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> CausalLM:
    torch.manual_seed(seed)  # module construction draws from the global RNG; keep it reproducible
    return init_random_weights(CausalLM(TINY_CONFIGS[name]), seed).to(dtype).eval()


def windowed_model(window: int = 6, every_layer: bool = True, seed: int = 0, base: str = "gqa_tied") -> CausalLM:
    """A tiny model whose layers slide over `window` positions: every layer (Mistral's way, so
    blocks behind the window can be released), or the last layer only (full and sliding layers
    side by side, as Qwen's max_window_layers or Gemma 3's pattern)."""
    import dataclasses

    config = TINY_CONFIGS[base]
    n = config.num_hidden_layers
    types = ["sliding_attention"] * n if every_layer else ["full_attention"] * (n - 1) + ["sliding_attention"]
    torch.manual_seed(seed)
    model = CausalLM(dataclasses.replace(config, sliding_window=window, layer_types=types))
    return init_random_weights(model, seed).eval()


def byte_tokenizer():
    """A byte-level tokenizer with one token per byte (ids 0..255), <s>=256, </s>=257, built
    offline with the `tokenizers` library: enough to run the whole pipeline on tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_unicode = sorted(alphabet, key=lambda ch: _unicode_to_byte(ch))
    vocab = {ch: i for i, ch in enumerate(byte_to_unicode)}
    vocab.update({"<s>": 256, "</s>": TINY_EOS})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)


def _unicode_to_byte(ch: str) -> int:
    """Inverse of GPT-2's byte->printable-unicode table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]


def save_hf_folder(model: CausalLM, tokenizer, path) -> None:
    """Write a model the way Hugging Face lays it out (config.json + model.safetensors +
    tokenizer files), so tests can load it back through every loader we have."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    tokenizer.save_pretrained(path)


def hf_twin(model: CausalLM):
    """A transformers model of the same family (config.architecture) holding exactly our weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**model.config.to_hf()), dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


def greedy_reference(hf, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' `generate`: the n greedy tokens after `ids` (EOS or not), and each one's log-probability."""
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                      output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    return tokens, [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]


@torch.no_grad()
def greedy_reference_uncached(hf, ids: list[int], n: int) -> list[int]:
    """transformers' n greedy tokens after `ids`, each from one full forward over the whole
    sequence (no KV cache). The reference for sliding-window models: in transformers 5.24,
    `generate`'s sliding-window cache disagrees with the same model's full forward once a short
    prompt's decode passes the window, and the full forward is the model's definition."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def save_transformers_model(hf_config, tokenizer, path, seed: int = 0):
    """A random model built and saved by transformers itself (`save_pretrained`, its own config
    class), norm weights moved off 1 so a skipped norm shows; returns the transformers model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return hf


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to n inside, put back after. Tests of tiny models run on one: a
    second thread does not speed them up, and where other work shares the cores, two threads wait
    for each other at every op (a tiny speculative step ran 50x slower so, measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
