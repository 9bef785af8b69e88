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
from course.s05_speculative.eagle import DEFAULT_HEAD, EagleDrafter, EagleHead, HeadMismatch
from course.s05_speculative.prompt_lookup import PromptLookupDrafter
from course.s05_speculative.tree import Calibration, Tree


class DraftSource:
    """One drafter shared by every request (it keeps no state between calls)."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    def propose(self, req: Request, k: int) -> Draft:
        return self.drafter.propose(req.seq, k)

    def features_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """What `observe` reads of the step's forward, row for row (stage 05's Drafter.features_of)."""
        return self.drafter.features_of(hidden)

    def observe(self, req: Request, hidden: torch.Tensor, start: int) -> None:
        """The target's features (`features_of`) of positions start.. of `req`, all on kept tokens."""

    def catch_up(self, req: Request) -> int:
        """Positions the drafter reads before it can draft for `req` (what a proposal costs
        besides its draft steps grows with them)."""
        return 0

    def prune(self, alive: set[int]) -> None:
        """Drop whatever was kept for requests not in `alive` (finished, aborted, failed)."""


class EagleSource(DraftSource):
    """An EagleDrafter per request around one shared head (the head's weights are shared; the
    features and the head's KV cache are the request's own)."""

    def __init__(self, head: EagleHead, target):
        self.head, self.target = head, target
        self.per_request: dict[int, EagleDrafter] = {}
        self.calibration = Calibration()  # the head's tree chances against what verification kept, all requests
        self.tapped_model = None  # the model whose forward leaves the layers an EAGLE-3 head reads

    def use_engine_products(self, engine_model) -> None:
        """Where the engine multiplies by the lm_head with stage 06's C product (the cpu
        backend's one-call layers), the head's draft-vocabulary logits use it too, in int8 as a
        draft's linears are: torch's `linear` runs a one-row product on one thread (1.2 ms for
        SmolLM2's 8k draft rows on our 2-core CPU; the C product on int8 rows ~0.2 ms), and a
        chain pays it once per draft token."""
        kernels = getattr(engine_model, "layer_kernels", None)
        if getattr(kernels, "head", None) is not None and self.head.draft_vocab is not None:
            self.head.vocab_product = kernels.draft_product

    def tap(self, engine_model) -> None:
        """Ask the model the engine runs (stage 06's fused copy, say) for the head's layers."""
        if self.head.tap_layers:
            engine_model.tap_layers = self.head.tap_layers
            self.tapped_model = engine_model

    @torch.no_grad()
    def features_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every row's feature in one call: an EAGLE-3 head's fusion of the taps is one matrix
        product for the whole step, not one per request (a single row reads all of `fuse`)."""
        if self.tapped_model is None:
            return self.head.input_features(hidden)
        tapped = self.tapped_model.tapped
        if tapped is None or tapped.shape[0] != hidden.shape[0]:  # a path that ran without the taps
            raise RuntimeError("the step's forward left no taps for its rows; the EAGLE-3 head cannot draft from it")
        return self.head.input_features(tapped)

    def _drafter(self, req: Request) -> EagleDrafter:
        drafter = self.per_request.get(req.request_id)
        if drafter is None:
            drafter = self.per_request[req.request_id] = EagleDrafter(self.head, self.target, self.calibration)
            drafter.begin(req.seq)
        return drafter

    def propose(self, req: Request, k: int) -> Draft:
        drafter = self.per_request.get(req.request_id)
        if drafter is None or drafter.num_features != req.num_computed_tokens:
            return Draft([])  # it has not seen every computed position yet (cannot happen when caught up)
        return drafter.propose(req.seq, k)

    def propose_tree(self, req: Request, depth: int, max_nodes: int, cost=None) -> Tree:
        """An EAGLE-2 tree (stage 05's propose_tree: 4 children per expanded node), sized by `cost`."""
        drafter = self.per_request.get(req.request_id)
        if drafter is None or drafter.num_features != req.num_computed_tokens:
            return Tree()
        return drafter.propose_tree(req.seq, depth, top_k=4, max_nodes=max_nodes, cost=cost)

    def observe(self, req: Request, features: torch.Tensor, start: int) -> None:
        self._drafter(req).observe(features, start)

    def catch_up(self, req: Request) -> int:
        """The positions whose features the head has not read yet (all of them, after an idle
        stretch: the head runs only when its request drafts)."""
        drafter = self.per_request.get(req.request_id)
        if drafter is None:
            return req.num_computed_tokens
        return drafter.num_features - (drafter.cache.num_tokens if drafter.cache is not None else 0)

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
    return EagleSource(load_eagle_head(Path(eagle_head or DEFAULT_HEAD), target), target)


TRAIN_A_HEAD = ("python -m course.s05_speculative.training.train_eagle --model MODEL --out head.safetensors`, "
                "then `--speculative-model head.safetensors")


def load_eagle_head(path: Path, target) -> EagleHead:
    """The head at `path`, or a clear refusal: no such file, not a head, or a head trained for a
    model of other shapes (stage 05's EagleHead.load names them)."""
    if not path.is_file():
        raise ValueError(f"cannot load the EAGLE head {path}: no such file; train one for your model with "
                         f"`{TRAIN_A_HEAD}`")
    try:
        return EagleHead.load(path, target)
    except HeadMismatch as e:
        with safe_open(str(path), "pt") as f:  # the command that made it, from its metadata
            made_by = (f.metadata() or {}).get("command", "a training run for another model")
        config = target.config
        raise ValueError(f"cannot load the EAGLE head {path} for this model ({config.architecture}, hidden size "
                         f"{config.hidden_size}, {config.num_hidden_layers} layers, vocabulary {config.vocab_size}): "
                         f"the head was made by `{made_by}` for a model whose shapes differ ({e}); train one for "
                         f"your model with `{TRAIN_A_HEAD}`") from None
    except Exception as e:  # noqa: BLE001 - safetensors and torch raise their own errors for a damaged file
        raise ValueError(f"cannot load the EAGLE head {path}: not a head file ({e})") from None
