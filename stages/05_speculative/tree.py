"""Tree speculation (EAGLE-2, Li et al. 2024): draft several continuations, verify them all in
ONE target forward, keep the longest path the target agrees with.

A chain bets everything on one guess per position; a tree hedges. The head expands, level by
level, the most confident nodes (score = the sum of log-probabilities along the path, which
approximates the chance that the target accepts the whole path), then keeps the best
`max_nodes` of all it drafted. The target reads the tree flattened, each node attending to the
cached prefix and to its own ancestors only (a *tree attention mask*), at position
prefix + depth. Greedy verification walks down from the root, always to the child whose token
is the target's choice; the accepted nodes' K/V are then moved to consecutive cache slots.
Trees verify greedy requests; sampled requests use the chain (EAGLE's multi-round rejection
sampling for trees is left out).

How many nodes to verify is a trade: on a GPU a forward over 17 tokens costs about what one
costs, on our CPU about twice. Given what a verify of t tokens costs here (`VerifyCost`, measured once)
and each drafted node's chance to be accepted (EAGLE-2 reads it off the path's probability),
`tree_size` keeps the m best nodes that maximize expected tokens per second of the step
(drafting included). A small head's probabilities are not its acceptance (ours is
under-confident, more so deeper in the tree), so `Calibration` rescales them per depth by what
the target actually accepted.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import torch

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata
from course.s02_kv_cache.kv_cache import KVCache


@dataclass
class Tree:
    """Drafted nodes, parents before children. Node i: token, parent (-1 = the root, i.e. the
    last emitted token), depth (1 = a child of the root), and the drafter's uncalibrated chance
    that the target accepts its whole path (empty when the drafter gives none)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    chances: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, chance: float | None = None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        if chance is not None:
            self.chances.append(chance)
        return len(self.tokens) - 1

    def first(self, n: int) -> "Tree":
        """The first n nodes: still a tree, since parents come before their children."""
        return Tree(self.tokens[:n], self.parents[:n], self.depths[:n], self.chances[:n])

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def block_mask(self) -> torch.Tensor:
        """[1 + N, 1 + N] bool for the verification block [root, nodes...]: row i may see
        column j iff j is i itself or one of its ancestors (the root is everyone's)."""
        n = len(self) + 1
        mask = torch.eye(n, dtype=torch.bool)
        mask[:, 0] = True
        for i in range(len(self)):
            for a in self.path_to(i):
                mask[i + 1, a + 1] = True
        return mask


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention with an explicit [Tq, Tk] boolean mask (True = may attend); GQA aware."""
    h, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    k = k.repeat_interleave(h // hkv, dim=1)
    v = v.repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * d ** -0.5
    scores = scores.masked_fill(~mask.to(q.device), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v.float()).to(q.dtype)


class TreeAttention(AttentionBackend):
    """Append this block's K/V after what the cache holds; every query sees the first
    `prefix_len` slots (the real sequence) and, among the slots after them, what `mask` allows.
    `mask`: [block, slots written after the prefix, this block included]."""

    def __init__(self, cache: KVCache, prefix_len: int, mask: torch.Tensor):
        self.cache, self.prefix_len, self.mask = cache, prefix_len, mask

    def forward(self, layer, q, k, v, meta: AttentionMetadata):
        total = int(meta.seq_lens[0])
        start = total - q.shape[0]
        self.cache.write(layer, start, k, v)
        full = torch.cat([torch.ones(q.shape[0], self.prefix_len, dtype=torch.bool), self.mask], dim=1)
        return masked_attention(q, self.cache.k[layer, :total], self.cache.v[layer, :total], full)


def block_metadata(start_slot: int, positions: list[int], device) -> AttentionMetadata:
    """A block written at cache slots start_slot.., its tokens at the given (RoPE) positions,
    which in a tree repeat: siblings share a position."""
    return AttentionMetadata(positions=torch.tensor(positions, device=device),
                             cu_seqlens_q=torch.tensor([0, len(positions)], device=device),
                             seq_lens=torch.tensor([start_slot + len(positions)], device=device))


def accept_greedy_path(tree: Tree, choices: list[int]) -> tuple[list[int], list[int]]:
    """choices[i]: the target's greedy token after block row i (row 0 = root). Walk down while a
    child holds the target's choice. Returns (accepted node indices, tokens to emit)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path, node = [], -1
    while True:
        want = choices[node + 1]
        nxt = next((c for c in children.get(node, []) if tree.tokens[c] == want), None)
        if nxt is None:
            return path, [tree.tokens[i] for i in path] + [want]
        path.append(nxt)
        node = nxt


def compact(cache: KVCache, start: int, path: list[int]) -> None:
    """Move the accepted nodes' K/V (block rows 1 + i, at slots start + 1 + i) right after the
    root (slot start), in order; the cache then holds root + path and nothing else."""
    src = torch.tensor([start + 1 + i for i in path], dtype=torch.long)
    dst = torch.arange(start + 1, start + 1 + len(path))
    cache.k[:, dst] = cache.k[:, src]
    cache.v[:, dst] = cache.v[:, src]
    cache.num_tokens = start + 1 + len(path)


@dataclass
class VerifyCost:
    """Seconds of one target forward over `width` new tokens, measured at a few widths and
    interpolated linearly between them (and past the last two)."""
    seconds: dict[int, float]

    def __call__(self, width: int) -> float:
        widths = sorted(self.seconds)
        i = min(max(bisect.bisect_left(widths, width), 1), len(widths) - 1)
        (a, b), (ta, tb) = (widths[i - 1], widths[i]), (self.seconds[widths[i - 1]], self.seconds[widths[i]])
        return ta + (tb - ta) * (width - a) / (b - a)


class Calibration:
    """What the target accepts against what the head predicted, per depth of the tree.

    A node's chance (exp of its path's log-probability) is the head's guess; measured on
    held-out chat, our head's nodes at 0.3-0.6 were accepted 0.47-0.77 of the time, and
    deeper nodes are under-rated more. Each verified tree adds, per depth, its nodes' predicted
    chances and how many of them the target accepted; `chance` scales a new node's by their
    ratio. Counts age (FORGET a tree) so the ratio follows the text being written, and start
    from PRIOR trees' worth at ratio 1 (the head's own word)."""
    FORGET, PRIOR = 0.98, 1.0

    def __init__(self):
        self.accepted: dict[int, float] = {}
        self.predicted: dict[int, float] = {}

    def scale(self, depth: int) -> float:
        return (self.accepted.get(depth, 0.0) + self.PRIOR) / (self.predicted.get(depth, 0.0) + self.PRIOR)

    def chance(self, log_prob: float, depth: int, parent_chance: float = 1.0) -> float:
        """The calibrated chance, never above the parent's (a path is kept only whole)."""
        return min(math.exp(log_prob) * self.scale(depth), parent_chance)

    def record(self, tree: Tree, path: list[int]) -> None:
        """A verified tree: its nodes' predicted chances and the accepted path."""
        for counts in (self.accepted, self.predicted):
            for d in counts:
                counts[d] *= self.FORGET
        on_path = set(path)
        for i, (depth, chance) in enumerate(zip(tree.depths, tree.chances)):
            self.predicted[depth] = self.predicted.get(depth, 0.0) + chance
            self.accepted[depth] = self.accepted.get(depth, 0.0) + (i in on_path)


def tree_size(chances: list[float], cost, max_nodes: int, drafting: float = 0.0) -> int:
    """How many of the best drafted nodes to verify: the m <= max_nodes that maximizes the step's
    (1 + sum of their acceptance chances) / (drafting + cost(1 + m)), `drafting` being the
    seconds the tree took to draft (spent whatever m is, so it makes every extra node relatively
    cheaper). 0: verify no draft."""
    chances = sorted(chances, reverse=True)[:max_nodes]
    best, best_rate, expected = 0, 1.0 / (drafting + cost(1)), 1.0
    for m, chance in enumerate(chances, 1):
        expected += chance
        if expected / (drafting + cost(1 + m)) > best_rate:
            best, best_rate = m, expected / (drafting + cost(1 + m))
    return best


def deeper_may_pay(chances: list[float], likeliest: float, cost, max_nodes: int, drafting: float,
                   level_seconds: float) -> bool:
    """Whether drafting one more level could raise the step's expected tokens per second: even a
    child as likely as the likeliest node it could hang from (`likeliest`; a child is never
    likelier than its parent), bought with one more level's drafting (`level_seconds`)."""
    if max_nodes == 0:
        return False  # no room for a node at all
    m = tree_size(chances, cost, max_nodes, drafting)
    kept = sorted(chances, reverse=True)[:m]
    rate = (1 + sum(kept)) / (drafting + cost(1 + m))
    gain, width = (likeliest - kept[-1], 1 + m) if m == max_nodes else (likeliest, 2 + m)
    return (1 + sum(kept) + gain) / (drafting + level_seconds + cost(width)) > rate
