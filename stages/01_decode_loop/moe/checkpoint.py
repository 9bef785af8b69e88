"""Expert weights as checkpoints store them, into the stacked layout experts.py holds.

Two layouts exist for the same numbers:

* one tensor per expert, as published checkpoints (and transformers' save_pretrained) write:
  Qwen-MoE's `mlp.experts.N.{gate,up,down}_proj.weight`, Mixtral's
  `block_sparse_moe.experts.N.{w1,w3,w2}.weight` (w1 the gate, w3 the up, w2 the down);
* stacked, as transformers holds them in memory: `mlp.experts.gate_up_proj` [E, 2I, H] and
  `mlp.experts.down_proj` [E, H, I]. These pass through unchanged.
"""
from __future__ import annotations

import re

import torch

MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
PER_EXPERT = re.compile(r"^(.*\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")


def stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with every per-expert tensor replaced by the stacked ones (Mixtral's
    `block_sparse_moe.gate` renamed `mlp.gate`); a dense or already stacked one is returned as is."""
    out: dict[str, torch.Tensor] = {}
    per_layer: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in state.items():
        m = PER_EXPERT.match(name)
        if m is None:
            out[name.replace(".block_sparse_moe.", ".mlp.")] = tensor
            continue
        layer, expert, proj = m.group(1), int(m.group(2)), MIXTRAL_NAMES.get(m.group(3), m.group(3))
        per_layer.setdefault(layer, {}).setdefault(proj, {})[expert] = tensor
    for layer, projs in per_layer.items():
        ordered = {proj: [by_expert[e] for e in sorted(by_expert)] for proj, by_expert in projs.items()}
        gate_up = [torch.cat([g, u]) for g, u in zip(ordered["gate_proj"], ordered["up_proj"])]
        out[layer + "mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[layer + "mlp.experts.down_proj"] = torch.stack(ordered["down_proj"])
    return out
