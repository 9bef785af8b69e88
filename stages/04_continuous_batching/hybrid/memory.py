"""Memory a sequence needs at long context, for models beyond full attention: computed from each
model's published shape, and measured on this engine with tiny models of the same layer pattern.

    python -m course.s04_continuous_batching.hybrid.memory [--context 8192] [--out results/window_memory.json]

Per sequence at `context` tokens, K/V in bfloat16, states in float32, blocks of 16:
* full attention: every layer keeps K/V for every position;
* ideal: a sliding layer keeps its window (window / block + 2 blocks), a linear-attention layer
  one state; what a pool with a layer group per rule (vLLM's hybrid manager) would hold;
* this engine: the blocks its block manager holds, measured by running a tiny model with the
  same layers and window over `context` tokens (prefilled in chunks of 1024), times the real
  shape's bytes per block; plus the
  states its state cache keeps. One block table serves every layer here, so a model with any
  full-attention layer keeps every block in every layer, and the pool has K/V room in the
  linear layers too.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer

from ..engine import EngineConfig, LLMEngine

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"

# published shapes (each model's config.json on the Hugging Face hub)
MODELS = {
    "Mistral-7B-v0.1": dict(layers=[SLIDING] * 32, window=4096, kv_heads=8, head_dim=128),
    "gemma-3-1b": dict(layers=([SLIDING] * 5 + [FULL]) * 4 + [SLIDING] * 2, window=512, kv_heads=1, head_dim=256),
    "gpt-oss-20b": dict(layers=[SLIDING, FULL] * 12, window=128, kv_heads=8, head_dim=64),
    "Qwen3-Next-80B-A3B": dict(layers=([LINEAR] * 3 + [FULL]) * 12, window=None, kv_heads=2, head_dim=256,
                               state=dict(key_heads=16, value_heads=32, key_dim=128, value_dim=128, conv=4)),
}
BLOCK, KV_BYTES, STATE_BYTES = 16, 2, 4


def state_bytes(s: dict) -> int:
    conv = (s["conv"] - 1) * (2 * s["key_heads"] * s["key_dim"] + s["value_heads"] * s["value_dim"])
    return STATE_BYTES * (conv + s["value_heads"] * s["key_dim"] * s["value_dim"])


def computed(m: dict, context: int) -> dict:
    per_token_layer = 2 * m["kv_heads"] * m["head_dim"] * KV_BYTES  # K and V
    blocks = -(-context // BLOCK)
    full = len(m["layers"]) * blocks * BLOCK * per_token_layer
    ideal = 0
    for kind in m["layers"]:
        if kind == FULL:
            ideal += blocks * BLOCK * per_token_layer
        elif kind == SLIDING:
            ideal += min(blocks, m["window"] // BLOCK + 2) * BLOCK * per_token_layer
        else:
            ideal += state_bytes(m["state"])
    return {"full_attention_bytes": full, "ideal_bytes": ideal, "per_block_all_layers": BLOCK * per_token_layer
            * len(m["layers"])}


def measured_blocks(m: dict, context: int) -> int:
    """The most blocks the engine's block manager held for one sequence of `context` tokens, with
    a tiny model of the same layer kinds and window (a linear layer stands in as a full one:
    the pool holds blocks for it alike)."""
    kinds = [SLIDING if k == SLIDING else FULL for k in m["layers"]]
    config = dataclasses.replace(TINY_CONFIGS["gqa_tied"], num_hidden_layers=len(kinds), hidden_size=32,
                                 intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                 max_position_embeddings=context + 8, sliding_window=m["window"],
                                 layer_types=kinds if m["window"] else None)
    torch.manual_seed(0)
    model = init_random_weights(CausalLM(config), 0).eval()
    engine = LLMEngine(model, byte_tokenizer(), EngineConfig(num_blocks=context // BLOCK + 8, block_size=BLOCK,
                                                             max_num_batched_tokens=1024, enable_prefix_caching=False))
    prompt = torch.randint(0, 256, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True))
    held, run = [], engine._run

    def counting_run(chunks, *args):  # at each forward: its blocks taken, none released yet (the peak)
        held.append(engine.blocks.blocks_held(rid))
        return run(chunks, *args)

    engine._run = counting_run
    while engine.has_unfinished():
        engine.step()
    return max(held)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--out", default=str(Path(__file__).parents[1] / "results" / "window_memory.json"))
    args = p.parse_args(argv)
    rows = []
    for name, m in MODELS.items():
        c = computed(m, args.context)
        blocks = measured_blocks(m, args.context)
        states = sum(state_bytes(m["state"]) for k in m["layers"] if k == LINEAR) if "state" in m else 0
        engine = blocks * c["per_block_all_layers"] + states
        row = {"name": name, "context": args.context, "blocks_held": blocks,
               "full_attention_MiB": round(c["full_attention_bytes"] / 2**20, 1),
               "ideal_MiB": round(c["ideal_bytes"] / 2**20, 1), "this_engine_MiB": round(engine / 2**20, 1),
               "ideal_vs_full": round(c["ideal_bytes"] / c["full_attention_bytes"], 3),
               "engine_vs_full": round(engine / c["full_attention_bytes"], 3)}
        rows.append(row)
        print(json.dumps(row))
    command = "python -m course.s04_continuous_batching.hybrid.memory" + (
        f" --context {args.context}" if args.context != 8192 else "")
    Path(args.out).write_text(json.dumps({"command": command, "block_size": BLOCK, "kv_dtype": "bfloat16",
                                          "state_dtype": "float32", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
