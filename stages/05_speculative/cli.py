"""`python -m course.s05_speculative --method draft|lookup|eagle|eagle-tree [--k K] ...`: stage 01's CLI contract
plus the drafter; `--json` adds the acceptance statistics of each prompt."""
from __future__ import annotations

import argparse
from pathlib import Path

from course.s01_decode_loop.cli import main as stage_main

from .draft_model import DraftModelDrafter, truncated_model
from .drafter import Drafter
from .eagle import DEFAULT_HEAD, EagleDrafter, EagleHead
from .prompt_lookup import PromptLookupDrafter
from .speculative import SpeculativeGenerator, measure_verify_cost

METHODS = ("draft", "lookup", "eagle", "eagle-tree")


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("speculative decoding")
    g.add_argument("--method", choices=METHODS, default="lookup")
    g.add_argument("--k", type=int, default=4, help="tokens drafted per target forward")
    g.add_argument("--draft-layers", type=int, default=4,
                   help="draft = the target's first N layers + its norm and lm_head (--method draft)")
    g.add_argument("--max-ngram", type=int, default=3, help="longest suffix matched (--method lookup)")
    g.add_argument("--eagle-head", type=Path, default=DEFAULT_HEAD, help="trained EAGLE head (safetensors)")
    g.add_argument("--tree-depth", type=int, default=5, help="levels drafted (--method eagle-tree)")
    g.add_argument("--tree-top-k", type=int, default=4, help="nodes expanded per level, children per node")
    g.add_argument("--tree-nodes", type=int, default=16, help="most nodes verified per target forward")
    g.add_argument("--tree-size", choices=["cost", "fixed"], default="cost",
                   help="cost: keep the nodes that pay for their verify on this machine (measured at start); "
                        "fixed: always --tree-nodes")


def make_drafter(method: str, model, args: argparse.Namespace) -> Drafter:
    if method == "draft":
        return DraftModelDrafter(truncated_model(model, args.draft_layers))
    if method.startswith("eagle"):
        if not args.eagle_head.is_file():
            raise ValueError(f"no EAGLE head at {args.eagle_head}; train one with "
                             "`python -m course.s05_speculative.training.train_eagle` or pass --eagle-head")
        return EagleDrafter(EagleHead.load(args.eagle_head, model), model)
    return PromptLookupDrafter(max_ngram=args.max_ngram)


def make_stream(loaded, args: argparse.Namespace) -> SpeculativeGenerator:
    if args.k < 0:
        raise ValueError(f"--k must be >= 0, got {args.k}")
    tree = None
    if args.method == "eagle-tree":
        if args.temperature != 0:
            raise ValueError("--method eagle-tree verifies greedy requests only: pass --temperature 0")
        tree = {"depth": args.tree_depth, "top_k": args.tree_top_k, "max_nodes": args.tree_nodes}
    cost = measure_verify_cost(loaded.model) if tree is not None and args.tree_size == "cost" else None
    return SpeculativeGenerator(make_drafter(args.method, loaded.model, args), args.k, tree, cost)


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, description="Stage 05: speculative decoding with exact verification.",
                      make_stream=make_stream, add_args=add_args)
