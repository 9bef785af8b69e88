"""Where the batch's drafts come from: stage 05's drafters, one state per request.

Stage 05's drafters serve one sequence at a time. In a continuous batch many requests draft in
the same step, and a drafter with state (EAGLE keeps the target's features and its own one-layer
KV cache) needs that state per request, fed with the target's hidden states of every chunk the
request ran (prefill chunks included) and rolled back to the accepted length after verification.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from course.s04_continuous_batching.request import Request
from course.s05_speculative.drafter import Draft, Drafter
from course.s05_speculative.eagle import DEFAULT_HEAD, EagleDrafter, EagleHead
from course.s05_speculative.prompt_lookup import PromptLookupDrafter


class DraftSource:
    """One drafter shared by every request (it keeps no state between calls)."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    def propose(self, req: Request, k: int) -> Draft:
        return self.drafter.propose(req.seq, k)

    def observe(self, req: Request, hidden: torch.Tensor, start: int) -> None:
        """The target's final hidden states of positions start.. of `req`, all on kept tokens."""

    def prune(self, alive: set[int]) -> None:
        """Drop whatever was kept for requests not in `alive` (finished, aborted, failed)."""


class EagleSource(DraftSource):
    """An EagleDrafter per request around one shared head (the head's weights are shared; the
    features and the head's KV cache are the request's own)."""

    def __init__(self, head: EagleHead, target):
        self.head, self.target = head, target
        self.per_request: dict[int, EagleDrafter] = {}

    def _drafter(self, req: Request) -> EagleDrafter:
        drafter = self.per_request.get(req.request_id)
        if drafter is None:
            drafter = self.per_request[req.request_id] = EagleDrafter(self.head, self.target)
            drafter.begin(req.seq)
        return drafter

    def propose(self, req: Request, k: int) -> Draft:
        drafter = self.per_request.get(req.request_id)
        if drafter is None or drafter.num_features != req.num_computed_tokens:
            return Draft([])  # it has not seen every computed position yet (cannot happen when caught up)
        return drafter.propose(req.seq, k)

    def observe(self, req: Request, hidden: torch.Tensor, start: int) -> None:
        self._drafter(req).observe(hidden, start)

    def prune(self, alive: set[int]) -> None:
        for request_id in set(self.per_request) - alive:
            del self.per_request[request_id]


class BorrowedTarget:
    """The target as EAGLE borrows it: the model passed in (embedding, config, device), but the
    lm_head as the engine runs it (split over the cores, or int8: stage 06), so a drafted
    token's logits cost what the target's own do. torch's unsplit lm_head decodes one row on
    one thread: ~10 ms a draft token on our 2-core CPU, more than the rest of the draft step."""

    def __init__(self, model, engine_model):
        self._model, self.engine_model = model, engine_model

    def compute_logits(self, hidden):
        return self.engine_model.compute_logits(hidden)

    def __getattr__(self, name):
        return getattr(self._model, name)


def make_source(method: str, target, eagle_head: str | Path | None = None) -> DraftSource | None:
    if method == "none":
        return None
    if method == "lookup":
        return DraftSource(PromptLookupDrafter())
    path = Path(eagle_head or DEFAULT_HEAD)
    check_eagle_head(path, target.config)
    try:
        head = EagleHead.load(path, target)
    except (RuntimeError, OSError) as e:  # a damaged file
        raise ValueError(f"cannot load the EAGLE head {path} for this model: {e}") from None
    return EagleSource(head, target)


TRAIN_A_HEAD = ("python -m course.s05_speculative.training.train_eagle --model MODEL --out head.safetensors`, "
                "then `--speculative-model head.safetensors")


def check_eagle_head(path: Path, config) -> None:
    """Refuse, before loading, a head file that is missing or was trained for another model: its
    shapes (hidden size, attention heads, draft token ids) must fit the model being served."""
    if not path.is_file():
        raise ValueError(f"cannot load the EAGLE head {path}: no such file; train one for your model with "
                         f"`{TRAIN_A_HEAD}`")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
            top_id = int(f.get_tensor("draft_vocab").max()) if "draft_vocab" in shapes else None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error for a file that is not one
        raise ValueError(f"cannot load the EAGLE head {path}: not a safetensors file ({e})") from None
    want = {"fc.weight": [config.hidden_size, 2 * config.hidden_size],
            "layer.self_attn.q_proj.weight": [config.num_attention_heads * config.head_dim, config.hidden_size]}
    problems = [f"{name} is {shapes.get(name)}, this model needs {shape}"
                for name, shape in want.items() if shapes.get(name) != shape]
    if top_id is not None and top_id >= config.vocab_size:
        problems.append(f"it drafts token id {top_id}, this model's vocabulary has {config.vocab_size}")
    if problems:
        made_by = meta.get("command", "a training run for another model")
        raise ValueError(f"cannot load the EAGLE head {path} for this model ({config.architecture}, hidden size "
                         f"{config.hidden_size}, vocabulary {config.vocab_size}): the head was made by `{made_by}` "
                         f"for a model whose shapes differ ({'; '.join(problems)}); train one for your model with "
                         f"`{TRAIN_A_HEAD}`")
