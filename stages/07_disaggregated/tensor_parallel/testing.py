"""Helpers for the tests of tensor parallelism (and final/'s): a tiny model whose widths split in
two and whose vocabulary does not, saved as a folder every rank loads; engines on both sides."""
from __future__ import annotations

import torch

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.testing import TINY_CONFIGS, save_hf_folder
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

# qwen2_bias (6 heads / 2 KV heads: GQA groups of 3; q/k/v biases; untied), its vocabulary 259
# (the byte tokenizer's 258 ids and one never used): odd, so each rank's slice carries padding
TP_TINY = ModelConfig(**{**TINY_CONFIGS["qwen2_bias"].to_dict(), "vocab_size": 259})


def save_tp_tiny(tokenizer, path, seed: int = 0):
    torch.manual_seed(seed)
    save_hf_folder(init_random_weights(CausalLM(TP_TINY), seed).eval(), tokenizer, path)
    return path


def reference_engine(folder, **config) -> LLMEngine:
    """TP=1: the same folder, the same engine on the whole model."""
    loaded = load_model(folder)
    return LLMEngine(loaded.model, loaded.tokenizer, KernelEngineConfig(**config), loaded.eos_token_ids)


def tp_engine(tp, loaded, model, **config) -> LLMEngine:
    """Rank 0's engine on its shard, attached to the group (every rank builds its pool anew)."""
    engine = LLMEngine(model, loaded.tokenizer, KernelEngineConfig(**config), loaded.eos_token_ids)
    tp.attach(engine, log=lambda line: None)
    return engine
