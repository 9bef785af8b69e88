"""How big is the KV cache? Every token keeps, in every layer, one key and one value vector
per KV head:

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

    python -m course.s02_kv_cache.kv_size [--tokens 4096] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse

import torch

from course.s01_decode_loop.config import ModelConfig

# Llama-3-70B's published shape (80 layers, 64 query heads, 8 KV heads, head dim 128).
LLAMA3_70B = ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                         max_position_embeddings=8192)


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float16) -> int:
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype_bytes(dtype)


def kv_bytes_per_request(config: ModelConfig, tokens: int, dtype: torch.dtype = torch.float16) -> int:
    return kv_bytes_per_token(config, dtype) * tokens


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def main() -> None:
    from course.s01_decode_loop.weights import load_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16", "float8_e4m3fn"])
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    for name, cfg in [("SmolLM2-135M-Instruct", load_model().config), ("Llama-3-70B", LLAMA3_70B)]:
        print(f"{name:24} {human(kv_bytes_per_token(cfg, dtype)):>10} per token   "
              f"{human(kv_bytes_per_request(cfg, args.tokens, dtype)):>10} per {args.tokens}-token request ({args.dtype})")


if __name__ == "__main__":
    main()
