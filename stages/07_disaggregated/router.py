"""Routing requests among replicas: round-robin, least-loaded, and cache-aware (SGLang's router).

Why route by prefix. Each replica (worker) has its own KV cache, with stage 03's prefix caching
inside it: a prompt whose first blocks that replica has already computed skips their prefill.
Replica B cannot use what replica A computed. Chat turns repeat the whole conversation so far,
agents and few-shot templates repeat long system prompts; round-robin scatters these over N
replicas, so each replica pays for the same prefix again. A router that remembers *where* it sent
each prefix can send the next request with that prefix to the same place and save the prefill.

The router cannot ask every replica what it has cached before each request, so it keeps an
*approximate* picture: what it sent to each replica, forgotten least-recently-used first, at about
the rate the replica itself would evict. It stores prompts as stage 03's chained block hashes:
block i is named by hash_block(hash of block i-1, its block_size tokens), so one hash names a
whole prefix, the set of hashes is a prefix tree, and a match is counted in full blocks, the unit
a replica's prefix cache can reuse. (sgl-router keeps a radix tree over characters instead, to
skip tokenizing; we already hold token ids.)

The cache-aware policy, as SGLang's router does it ("cache_aware" in sgl-router, now the SGLang
Model Gateway: github.com/sgl-project/sglang, sgl-router/src/policies/cache_aware.rs):
  1. If the loads are imbalanced, send the request to the least-loaded replica, whatever its cache.
  2. Else find the replica whose remembered prefix matches the prompt longest. If the matched
     fraction of the prompt reaches `cache_threshold`, send it there (a cache hit).
  3. Else send it to the replica that remembers the least (most free cache), so different
     prefixes settle on different replicas and the N caches hold N different working sets.
  Whichever replica is chosen then remembers this prompt.

Why the balance thresholds. Pure affinity makes hot spots: one popular system prompt would pull
all traffic onto one replica while the others idle, and waiting in its queue costs more than the
saved prefill. "Imbalanced" needs both
    max_load - min_load > balance_abs_threshold   (a gap of a few requests at low load is noise:
                                                   1 vs 3 is a ratio of 3 and means nothing)
    max_load > balance_rel_threshold * min_load    (at high load a fixed gap is small: 100 vs 110
                                                   is balanced though 10 apart)
Load is what the caller reports (on_dispatch / on_finish): outstanding requests or tokens.

Differences from sgl-router, on purpose: block hashes instead of characters; eviction runs
synchronously on every insert (sgl-router evicts in a background thread every few seconds), so
the size bound always holds; a hit needs match ratio >= cache_threshold (sgl-router: >) and at
least one matched block; dead replicas take no part in the balance check; ties go to the replica
chosen least recently, so an idle cluster still spreads requests.

In disaggregated serving the prefill pool is where prefix reuse saves compute, so it wants the
cache-aware policy; the decode pool has no prefill to save and wants least-loaded.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from course.s03_paged.block_manager import hash_block

POLICIES = ("round_robin", "least_loaded", "cache_aware")
LOAD_METRICS = ("requests", "tokens")


class NoAliveWorkerError(RuntimeError):
    """Every worker is marked dead: there is nowhere to send the request."""


def prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hash of every *full* block of `token_ids` (a partial last block is never
    shared by a prefix cache, so it is not remembered either)."""
    hashes, prev = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash_block(prev, token_ids[start:start + block_size])
        hashes.append(prev)
    return hashes


class PrefixTree:
    """What one worker has probably cached: a prefix tree whose nodes are full blocks, each named
    by its chained hash, kept in least-recently-used order.

    Invariant: a node's parent is always more recently used than the node (`insert` touches a
    path from its leaf up to the root). So the least recently used node is always a leaf, and
    eviction removes the ends of prefixes before their beginnings, never orphaning a subtree."""

    def __init__(self, block_size: int, max_tokens: int):
        self.block_size = block_size
        self.max_blocks = max_tokens // block_size
        self.nodes: OrderedDict[bytes, bytes | None] = OrderedDict()  # hash -> parent; LRU first

    @property
    def num_tokens(self) -> int:
        return len(self.nodes) * self.block_size

    def match_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the prompt this worker has seen."""
        matched = 0
        for h in hashes:  # a chained hash names its whole prefix: stop at the first miss
            if h not in self.nodes:
                break
            matched += 1
        return matched

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Remember a prompt (or refresh it), then forget the least recently used blocks."""
        parents = [None, *hashes[:-1]]
        for h, parent in reversed(list(zip(hashes, parents))):  # leaf first, root last
            self.nodes[h] = parent
            self.nodes.move_to_end(h)
        while len(self.nodes) > self.max_blocks:
            self.nodes.popitem(last=False)  # a leaf, by the invariant above

    def clear(self) -> None:
        self.nodes.clear()


@dataclass(frozen=True)
class RouteDecision:
    worker: Hashable
    reason: str          # round_robin | least_loaded | cache_hit | cache_miss | imbalanced
    matched_tokens: int  # prompt tokens the chosen worker has (by the router's picture) cached


@dataclass
class RouterStats:
    """Counted at routing time, for every policy, so a benchmark can compare them."""
    requests: int = 0
    prompt_tokens: int = 0
    matched_tokens: int = 0  # the router's estimate; the worker's BlockManager measures the truth
    reasons: dict[str, int] = field(default_factory=dict)
    per_worker: dict[Hashable, int] = field(default_factory=dict)

    @property
    def prefix_hit_rate(self) -> float:
        """Matched prompt tokens / prompt tokens: the share of prefill the routing can save."""
        return self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "matched_tokens": self.matched_tokens, "prefix_hit_rate": self.prefix_hit_rate,
                "reasons": dict(self.reasons), "per_worker": dict(self.per_worker)}


class Router:
    """Chooses a worker for each request. Pure bookkeeping: no processes, no I/O, one thread.

    The caller's loop:  worker = router.route(prompt_ids)
                        router.on_dispatch(worker, num_tokens)   # when it is sent
                        router.on_finish(worker, num_tokens)     # when it completes or fails
    `route` does not count load by itself: load is what the caller reports."""

    def __init__(self, workers: Iterable[Hashable], policy: str = "cache_aware", *,
                 block_size: int = 16, cache_threshold: float = 0.3,
                 balance_abs_threshold: float = 64, balance_rel_threshold: float = 1.5,
                 max_tree_tokens: int = 1 << 20, load_metric: str = "requests"):
        self.workers = list(workers)
        if not self.workers or len(set(self.workers)) != len(self.workers):
            raise ValueError("workers must be a non-empty list of distinct ids")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
        if load_metric not in LOAD_METRICS:
            raise ValueError(f"unknown load_metric {load_metric!r}; choose one of {LOAD_METRICS}")
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.policy, self.block_size, self.load_metric = policy, block_size, load_metric
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold, self.balance_rel_threshold = balance_abs_threshold, balance_rel_threshold
        self.trees = {w: PrefixTree(block_size, max_tree_tokens) for w in self.workers}
        self.outstanding_requests = {w: 0 for w in self.workers}
        self.outstanding_tokens = {w: 0 for w in self.workers}
        self.dead: set[Hashable] = set()
        self.stats = RouterStats()
        self._rr_next = 0                                    # round-robin position in self.workers
        self._last_chosen = {w: -1 for w in self.workers}    # routing step of each worker's last pick
        self._step = 0

    # ---- what the caller reports ------------------------------------------------------------
    def on_dispatch(self, worker: Hashable, num_tokens: int = 0) -> None:
        self.outstanding_requests[worker] += 1
        self.outstanding_tokens[worker] += num_tokens

    def on_finish(self, worker: Hashable, num_tokens: int = 0, token_ids: Sequence[int] | None = None) -> None:
        """The request left `worker`. Pass its full `token_ids` (prompt + output) to let the router
        remember them too: the next chat turn starts with all of them."""
        # max(0, ...): a worker marked dead and back may report requests from before
        self.outstanding_requests[worker] = max(0, self.outstanding_requests[worker] - 1)
        self.outstanding_tokens[worker] = max(0, self.outstanding_tokens[worker] - num_tokens)
        if token_ids is not None and worker not in self.dead:
            self.trees[worker].insert(prefix_block_hashes(token_ids, self.block_size))

    def report_load(self, worker: Hashable, requests: int, tokens: int = 0) -> None:
        """Overwrite the load with what the worker itself says (e.g. from a health poll)."""
        self._check(worker)
        self.outstanding_requests[worker], self.outstanding_tokens[worker] = requests, tokens

    def mark_dead(self, worker: Hashable) -> None:
        """Never choose `worker` again until mark_alive. Its cache is forgotten: a restarted
        process comes back empty, and routing to a stale picture would be wrong anyway."""
        self._check(worker)
        self.dead.add(worker)
        self.trees[worker].clear()

    def mark_alive(self, worker: Hashable) -> None:
        self._check(worker)
        self.dead.discard(worker)

    # ---- questions ----------------------------------------------------------------------------
    def load(self, worker: Hashable) -> int:
        return (self.outstanding_requests if self.load_metric == "requests" else self.outstanding_tokens)[worker]

    def alive_workers(self) -> list[Hashable]:
        return [w for w in self.workers if w not in self.dead]

    def is_imbalanced(self) -> bool:
        """SGLang's test: both an absolute and a relative gap between the extreme loads."""
        loads = [self.load(w) for w in self.alive_workers()]
        max_load, min_load = max(loads), min(loads)
        return (max_load - min_load > self.balance_abs_threshold
                and max_load > self.balance_rel_threshold * min_load)

    # ---- the decision ---------------------------------------------------------------------------
    def route(self, token_ids: Sequence[int]) -> Hashable:
        """The worker for a request with this prompt (and the router remembers it went there)."""
        return self.choose(token_ids).worker

    def choose(self, token_ids: Sequence[int]) -> RouteDecision:
        """Like `route`, and says why."""
        alive = self.alive_workers()
        if not alive:
            raise NoAliveWorkerError(f"all {len(self.workers)} workers are marked dead; nowhere to route")
        hashes = prefix_block_hashes(token_ids, self.block_size)
        matched = {w: self.trees[w].match_blocks(hashes) for w in alive}  # in blocks

        if self.policy == "round_robin":
            worker, reason = self._next_round_robin(), "round_robin"
        elif self.policy == "least_loaded":
            worker, reason = min(alive, key=lambda w: (self.load(w), self._last_chosen[w])), "least_loaded"
        elif self.is_imbalanced():  # cache_aware, step 1: balance wins over affinity
            worker = min(alive, key=lambda w: (self.load(w), -matched[w], self._last_chosen[w]))
            reason = "imbalanced"
        else:
            best = max(alive, key=lambda w: (matched[w], -self.load(w), -self._last_chosen[w]))
            ratio = matched[best] * self.block_size / len(token_ids) if token_ids else 0.0
            if matched[best] > 0 and ratio >= self.cache_threshold:  # step 2: affinity
                worker, reason = best, "cache_hit"
            else:  # step 3: the worker that remembers least has the most room for a new prefix
                worker = min(alive, key=lambda w: (self.trees[w].num_tokens, self.load(w), self._last_chosen[w]))
                reason = "cache_miss"

        self.trees[worker].insert(hashes)  # every policy keeps the picture, so stats compare
        self._step += 1
        self._last_chosen[worker] = self._step
        decision = RouteDecision(worker, reason, matched[worker] * self.block_size)
        self._count(decision, len(token_ids))
        return decision

    # ---- internals ----------------------------------------------------------------------------
    def _next_round_robin(self) -> Hashable:
        for _ in range(len(self.workers)):  # skip dead workers; at least one is alive
            worker = self.workers[self._rr_next]
            self._rr_next = (self._rr_next + 1) % len(self.workers)
            if worker not in self.dead:
                return worker
        raise AssertionError("unreachable: choose() checked that a worker is alive")

    def _count(self, decision: RouteDecision, prompt_tokens: int) -> None:
        s = self.stats
        s.requests += 1
        s.prompt_tokens += prompt_tokens
        s.matched_tokens += decision.matched_tokens
        s.reasons[decision.reason] = s.reasons.get(decision.reason, 0) + 1
        s.per_worker[decision.worker] = s.per_worker.get(decision.worker, 0) + 1

    def _check(self, worker: Hashable) -> None:
        if worker not in self.trees:
            raise KeyError(f"unknown worker {worker!r}; workers are {self.workers}")
