"""Memory a sequence needs at long context, for models beyond full attention: computed from each
model's published shape, and measured from the block manager's accounting.

    python -m course.s03_paged.bench.window_memory [--context 8192]

Per sequence at `context` tokens, K/V in bfloat16, linear-attention states in float32, blocks of 16:
* full attention: every layer keeps K/V for every position;
* ideal: a sliding layer keeps its window (window / block + 2 blocks), a linear-attention layer
  one state: what a pool with a block table per layer group (vLLM's hybrid manager) holds;
* this engine: the most bytes the block managers held for the sequence while it was prefilled in
  chunks of 512 and committed as stage 04's scheduler does (the first chunk's blocks at
  admission, then each chunk's, committed after its step): a block table per layer group where
  sliding layers sit beside full ones (layer_groups.py), each group's blocks costing its own
  layers; plus a linear layer's state (stage 04's hybrid/), which keeps no K/V.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..block_manager import BlockManager, uniform_window
from ..layer_groups import layer_groups

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
    return {"full_attention_bytes": full, "ideal_bytes": ideal}


def measured(m: dict, context: int, chunk: int = 512) -> tuple[int, list[int]]:
    """(the most K/V bytes the block managers held for one sequence prefilled in chunks, each
    chunk's blocks taken before its step and the computed prefix committed after it; the blocks
    each group held then)."""
    windows = tuple(m["window"] if k == SLIDING else None for k in m["layers"] if k != LINEAR)
    groups = layer_groups(windows) or [(uniform_window(windows), tuple(range(len(windows))))]
    managers = [BlockManager(-(-context // BLOCK) + 1, BLOCK, enable_prefix_caching=False, window=w) for w, _ in groups]
    per_block = [BLOCK * 2 * m["kv_heads"] * m["head_dim"] * KV_BYTES * len(layers) for _, layers in groups]
    ids, most = [i % 251 for i in range(context)], (0, [])
    for done in range(0, context, chunk):
        for bm in managers:
            bm.allocate(0, ids, budget=chunk) if done == 0 else bm.append_slot(0, min(done + chunk, context))
        held = [bm.blocks_held(0) for bm in managers]
        most = max(most, (sum(h * b for h, b in zip(held, per_block)), held))
        for bm in managers:
            bm.commit(0, ids, min(done + chunk, context))
    return most


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--out", default=str(Path(__file__).parents[1] / "results" / "window_memory.json"))
    args = p.parse_args(argv)
    rows = []
    for name, m in MODELS.items():
        c = computed(m, args.context)
        kv, blocks = measured(m, args.context)
        states = sum(state_bytes(m["state"]) for k in m["layers"] if k == LINEAR) if "state" in m else 0
        engine = kv + states
        row = {"name": name, "context": args.context, "blocks_held": blocks,
               "full_attention_MiB": round(c["full_attention_bytes"] / 2**20, 1),
               "ideal_MiB": round(c["ideal_bytes"] / 2**20, 1), "this_engine_MiB": round(engine / 2**20, 1),
               "ideal_vs_full": round(c["ideal_bytes"] / c["full_attention_bytes"], 3),
               "engine_vs_full": round(engine / c["full_attention_bytes"], 3)}
        rows.append(row)
        print(json.dumps(row))
    command = "python -m course.s03_paged.bench.window_memory" + (
        f" --context {args.context}" if args.context != 8192 else "")
    Path(args.out).write_text(json.dumps({"command": command, "block_size": BLOCK, "kv_dtype": "bfloat16",
                                          "state_dtype": "float32", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
