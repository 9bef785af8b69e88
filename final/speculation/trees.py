"""EAGLE-2 trees inside the continuous batch (stage 05's tree.py, verified among other requests).

A greedy request's chunk becomes [last token, node 1 .. node N]: its rows take consecutive K/V
slots, sit at positions last + depth (siblings share one), and attend to the cached prefix and
to their own path only (the runner's `trees`; stage 06's cpu and torch backends attend them).
The target's greedy choice at each row walks the tree from the root (stage 05's
`accept_greedy_path`); the accepted nodes' K/V then move to the slots right after the root, so
the request's cache holds exactly its emitted tokens, as after a chain.

How many nodes: the drafter keeps the likeliest ones that pay for their verify
(`tree_size`, with this step's cost of a row from the draft policy's fit, and the chances
calibrated by what the engine's verified trees accepted: one `Calibration` for all requests), at most
`--speculative-tree-nodes`; the scheduler may cut a tree to the step's budget, and since a
parent always precedes its children, any prefix of the nodes is still a tree. Sampled requests,
and requests with a grammar, penalties or logprobs, keep the chain.
"""
from __future__ import annotations

import torch

from course.s03_paged.paged_attention import PagedKVCache
from course.s05_speculative.tree import Tree, accept_greedy_path


class TreeDrafting:
    """The engine's seam `trees` (cli.py plugs it in for --speculative-tree): drafts a tree for
    each greedy request the draft policy gives k drafts (k deep), lays the trees out for the
    runner, walks each verified tree and moves its accepted K/V."""

    def __init__(self, engine, max_nodes: int = 8):
        if not 1 <= max_nodes <= 63:
            raise ValueError(f"a tree holds 1 to 63 nodes (its block of rows is at most 64), not {max_nodes}")
        if engine.layer_groups:
            raise ValueError("speculative trees on a model with layer groups (sliding layers beside full ones): a "
                             "tree's accepted K/V move within one pool; draft chains (drop --speculative-tree)")
        if not hasattr(engine.source, "propose_tree"):
            raise ValueError("speculative trees are drafted by an EAGLE head: use --speculative-method eagle")
        if not engine.attn.tree_masks:
            raise ValueError(f"the {engine.attn.name} attention backend does not verify speculative trees; "
                             "use the cpu or torch backend, or chains")
        self.engine, self.max_nodes = engine, max_nodes
        self.drafted: dict[int, Tree] = {}  # this step's trees by request id (the engine's drafts: their tokens)

    def propose(self, req, depth: int) -> Tree:
        """A greedy request's tree, `depth` deep, sized by this step's cost of a verified row."""
        engine = self.engine
        nodes = min(self.max_nodes, engine.max_model_len - req.num_tokens)  # its rows' K/V slots must fit
        policy = engine.draft_policy
        cost = policy.verify_cost(engine.other_rows({req.request_id: req})) if policy is not None else None
        tree = engine.source.propose_tree(req, depth, nodes, cost)
        if len(tree):
            self.drafted[req.request_id] = tree
        return tree

    def layouts(self, chunks, drafts: dict[int, list[int]]) -> dict | None:
        """The runner's `trees` for the step: each tree cut to the rows the scheduler gave it."""
        trees = {}
        for b, (req, _) in enumerate(chunks):
            tree, kept = self.drafted.get(req.request_id), drafts.get(req.request_id)
            if tree is not None and kept:
                self.drafted[req.request_id] = tree = tree.first(len(kept))
                trees[b] = layout(tree)
            else:
                self.drafted.pop(req.request_id, None)
        return trees or None

    def accept(self, req, start: int, choices: list[int]) -> tuple[list[int], list[int]]:
        """(tokens to emit, the chunk's rows that stay) from the target's greedy choice at each
        row; the accepted nodes' K/V are moved right after the root's."""
        tree = self.drafted[req.request_id]
        path, emitted = accept_greedy_path(tree, choices)
        self.engine.source.calibration.record(tree, path)
        move_accepted_kv(self.engine.cache, self.engine.blocks.tables[req.request_id], start, path)
        return emitted, [0] + [1 + i for i in path]


def layout(tree: Tree) -> tuple[list[int], torch.Tensor]:
    """The runner's view of a chunk [root, nodes...]: each row's depth below the root, and which
    rows each row attends to ([1 + N, 1 + N]: its ancestors and itself)."""
    return [0] + tree.depths, tree.block_mask()


def move_accepted_kv(cache: PagedKVCache, table: list[int], start: int, path: list[int]) -> None:
    """The accepted nodes' K/V (chunk rows 1 + i at slots start + 1 + i, for i in `path`) into the
    slots right after the root's (start), in path order, every layer at once. Reading all the
    sources before writing keeps it right when they overlap (path nodes only move down)."""
    moves = [(start + 1 + i, start + 1 + r) for r, i in enumerate(path) if i != r]
    if not moves:
        return
    bs = cache.block_size
    slot = lambda p: table[p // bs] * bs + p % bs  # noqa: E731
    src = torch.tensor([slot(a) for a, _ in moves], device=cache.k.device)
    dst = torch.tensor([slot(b) for _, b in moves], device=cache.k.device)
    for pool in cache.tensors():  # K and V, and a quantized pool's scales
        flat = pool.view(pool.shape[0], -1, *pool.shape[3:])  # [layers, slots, kv heads(, d)]
        flat[:, dst] = flat[:, src]
