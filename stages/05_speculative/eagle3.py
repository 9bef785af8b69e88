"""EAGLE-3 (Li et al., 2025): the head reads three of the target's layers and predicts tokens.

EAGLE-1 (eagle.py) asks its head for the target's next *final* hidden state: a feature shaped
for one question, which token comes next, and already stripped of much of what a draft two or
three steps ahead needs. EAGLE-3 changes what the head reads and what it predicts:

* **Reads three layers.** The outputs of a low, a middle and a high layer of the target (for
  SmolLM2's 30 layers: 2, 15 and 27), side by side [3h], projected to h by `fuse`. The low
  layer still knows the current token and its neighbours, the middle one the phrase, the high
  one the prediction. Inside a model the residual stream is not normalized, and a few tokens
  carry "massive activations" (SmolLM2's layers 15 and 27 reach 24,000 where a typical row's
  RMS is 7 to 27), so each tap is RMS-normalized before `fuse`, and whatever the head reads as
  its feature (fused taps, or its own previous output) is normalized again.
* **Predicts tokens, not features.** Its output is a free hidden state, trained only by the
  cross-entropy against the target's next-token distribution, and read through its own RMSNorm
  by the target's lm_head (the draft vocabulary's rows).
* **Chains on its own outputs.** Step 0 reads fuse(taps at t) and token t+1's embedding; a
  later step reads the previous step's output in fuse's place (a guess has no taps). Training-
  time test (training/eagle_training.py) trains exactly this chain, which is what lets a head
  that predicts no features stay on track for several steps.

Everything else is eagle.py's: EagleDrafter drafts chains and EAGLE-2 trees with either head,
because the two differences sit behind the head's `input_features` (fuse the taps) and
`readout` (the norm), and the target's forward leaves the taps in `model.model.tapped`.
"""
from __future__ import annotations

import torch
from torch import nn

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import RMSNorm

from .eagle import DEFAULT_HEAD, EagleHead

DEFAULT_HEAD3 = DEFAULT_HEAD  # training/train_eagle.py --head eagle3 writes the default head


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers (2, L/2, L-3), distinct and in order (a tiny test
    model may have fewer than three)."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


class Eagle3Head(EagleHead):
    predicts_features = False

    def __init__(self, target_config: ModelConfig, draft_vocab: torch.Tensor | None = None,
                 tap_layers: tuple[int, ...] | None = None):
        super().__init__(target_config, draft_vocab)
        taps = tuple(tap_layers) if tap_layers is not None else default_taps(target_config.num_hidden_layers)
        if list(taps) != sorted(set(taps)):
            raise ValueError(f"tap layers must be distinct and in order, got {taps}")
        self.tap_layers = taps
        self.register_buffer("taps", torch.tensor(taps, dtype=torch.int64))  # saved with the head
        h, eps = self.config.hidden_size, self.config.rms_norm_eps
        self.tap_norms = nn.ModuleList(RMSNorm(h, eps) for _ in taps)
        self.fuse = nn.Linear(len(taps) * h, h, bias=False)
        self.feature_norm = RMSNorm(h, eps)  # fused taps and the head's own outputs, on one scale
        self.norm = RMSNorm(h, eps)

    def input_features(self, tapped: torch.Tensor) -> torch.Tensor:
        parts = tapped.split(self.config.hidden_size, dim=-1)
        return self.fuse(torch.cat([norm(x) for norm, x in zip(self.tap_norms, parts)], dim=-1))

    def forward(self, features, token_embeds, attn, meta):
        return super().forward(self.feature_norm(features), token_embeds, attn, meta)

    def readout(self, predicted: torch.Tensor) -> torch.Tensor:
        return self.norm(predicted)

    @staticmethod
    def options_in(state: dict) -> dict:
        return {"draft_vocab": state.get("draft_vocab"), "tap_layers": tuple(state["taps"].tolist())}

    @staticmethod
    def id_problems(state: dict, config: ModelConfig) -> list[str]:
        problems = EagleHead.id_problems(state, config)
        taps = state["taps"].tolist()
        if max(taps) >= config.num_hidden_layers:
            problems.append(f"it reads layers {taps}, this model has {config.num_hidden_layers}")
        return problems
