"""For tests: a family's model on transformers' tiny config, with transformers' seeded weights."""
from __future__ import annotations

import importlib

import torch
from transformers import AutoModelForCausalLM

from . import FAMILIES, family_classes


def family_model(model_type: str, seed: int = 0):
    """Stage 01's model of `model_type` (a key of FAMILIES) holding the weights transformers
    draws for the family's `tiny_config()` after `torch.manual_seed(seed)`; in eval mode."""
    module = importlib.import_module(f"{__package__}.{FAMILIES[model_type][0]}")
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(module.tiny_config()).eval()
    config_class, model_class = family_classes(model_type)
    model = model_class(config_class.from_hf(hf.config))
    model.load_state_dict(hf.state_dict())
    return model.eval()
