"""Router policies: cache affinity (same prefix -> same replica), spreading of unrelated prompts,
the balance thresholds that override affinity (checked just below and just above), LRU
forgetting, dead replicas, round-robin, least-loaded, and the prefix-hit statistics."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.s07_disaggregated.router import (NoAliveWorkerError, PrefixTree, Router,
                                             prefix_block_hashes)

BS = 4
WORKERS = ["w0", "w1", "w2", "w3"]


def prompt(seed: int, length: int) -> list[int]:
    """Token ids unrelated to any other seed's (disjoint id ranges, so no shared first block)."""
    rng = random.Random(seed)
    return [seed * 1000 + rng.randrange(1000) for _ in range(length)]


def send(router: Router, token_ids: list[int]):
    """Route, dispatch and finish at once: affinity tests run with every load at zero."""
    decision = router.choose(token_ids)
    router.on_dispatch(decision.worker, len(token_ids))
    router.on_finish(decision.worker, len(token_ids))
    return decision


# ---- cache-aware: affinity and spreading ---------------------------------------------------------
def test_same_prompt_and_its_extensions_land_on_the_same_replica():
    router = Router(WORKERS, block_size=BS, cache_threshold=0.3)
    system = prompt(1, 32)
    first = send(router, system)
    assert first.reason == "cache_miss" and first.matched_tokens == 0
    turns = [system, system + prompt(2, 8), system + prompt(2, 8) + prompt(3, 40)]
    for t in turns:
        d = send(router, t)
        assert (d.worker, d.reason) == (first.worker, "cache_hit")
    assert d.matched_tokens == 40  # system + the second turn's 8 tokens, both whole blocks


def test_unrelated_prompts_spread_over_all_replicas():
    router = Router(WORKERS, block_size=BS)
    chosen = [send(router, prompt(seed, 16)).worker for seed in range(8)]
    assert sorted(chosen[:4]) == WORKERS          # each new prefix goes to an empty replica
    assert {w: chosen.count(w) for w in WORKERS} == {w: 2 for w in WORKERS}


def test_a_miss_goes_to_the_replica_that_remembers_least_even_if_a_little_busier():
    router = Router(["a", "b"], block_size=BS)  # balance_abs_threshold=64: 0 vs 1 is balanced
    assert send(router, prompt(1, 32)).worker == "a"
    router.report_load("b", 1)
    d = router.choose(prompt(2, 32))
    assert (d.worker, d.reason) == ("b", "cache_miss")


def test_interleaved_conversations_each_keep_their_replica():
    router = Router(WORKERS, block_size=BS)
    history = {c: prompt(10 + c, 24) for c in range(3)}
    home = {c: send(router, history[c]).worker for c in range(3)}
    assert len(set(home.values())) == 3
    for turn in range(4):
        for c in range(3):
            history[c] = history[c] + prompt(100 * turn + c, 8)
            assert send(router, history[c]).worker == home[c]


@pytest.mark.parametrize("prompt_len, expect", [
    (16, "cache_hit"),   # 8 of 16 tokens matched: ratio 0.5 == threshold, a hit
    (17, "cache_miss"),  # 8 of 17: ratio 0.47, just below
])
def test_cache_threshold_boundary(prompt_len, expect):
    router = Router(["a", "b"], block_size=BS, cache_threshold=0.5)
    shared = prompt(1, 8)
    home = send(router, shared).worker
    d = send(router, shared + prompt(2, prompt_len - 8))
    assert d.reason == expect and d.matched_tokens == (8 if expect == "cache_hit" else 0)
    assert (d.worker == home) == (expect == "cache_hit")  # a miss goes to the emptier replica


def test_finished_output_is_remembered_for_the_next_turn():
    router = Router(WORKERS, block_size=BS)
    turn1 = prompt(1, 12)
    w = router.route(turn1)
    router.on_dispatch(w, len(turn1))
    router.on_finish(w, len(turn1), token_ids=turn1 + prompt(2, 20))  # prompt + its answer
    d = router.choose(turn1 + prompt(2, 20) + prompt(3, 4))
    assert d.worker == w and d.matched_tokens == 32


# ---- cache-aware: the balance thresholds override affinity --------------------------------------
@pytest.mark.parametrize("abs_t, rel_t, home_load, other_load, overridden", [
    (4, 1.5, 6, 2, False),  # gap 4 == abs threshold: not above it
    (4, 1.5, 7, 2, True),   # gap 5 > 4 and 7 > 3
    (2, 2.0, 8, 4, False),  # gap 4 > 2, but 8 == 2.0 * 4: not above it
    (2, 2.0, 9, 4, True),   # 9 > 8
    (4, 1.5, 4, 0, False),  # an idle replica but the gap is only 4
    (4, 1.5, 5, 0, True),
    (4, 1.5, 0, 0, False),
    (4, 1.5, 2, 7, False),  # imbalanced, but the affine replica is the least loaded one
])
def test_imbalance_overrides_affinity_exactly_at_the_thresholds(abs_t, rel_t, home_load, other_load, overridden):
    router = Router(["a", "b"], block_size=BS, balance_abs_threshold=abs_t, balance_rel_threshold=rel_t)
    base = prompt(1, 32)
    home = send(router, base).worker
    other = "b" if home == "a" else "a"
    router.report_load(home, home_load)
    router.report_load(other, other_load)
    d = router.choose(base + prompt(2, 8))
    assert d.worker == (other if overridden else home)
    assert (d.reason == "imbalanced") == router.is_imbalanced()
    assert (d.reason == "cache_hit") == (not router.is_imbalanced())


@pytest.mark.parametrize("tokens_on_home, overridden", [(164, False), (165, True)])
def test_imbalance_measured_in_tokens(tokens_on_home, overridden):
    router = Router(["a", "b"], block_size=BS, load_metric="tokens",
                    balance_abs_threshold=64, balance_rel_threshold=1.5)
    base = prompt(1, 32)
    home = send(router, base).worker
    other = "b" if home == "a" else "a"
    router.on_dispatch(home, tokens_on_home)  # one request each: balanced in requests
    router.on_dispatch(other, 100)            # 164 - 100 == 64, not above; 165 is
    assert (router.choose(base).worker == other) == overridden


def test_load_hooks_count_outstanding_work():
    router = Router(["a", "b"], load_metric="requests")
    router.on_dispatch("a", 10)
    router.on_dispatch("a", 5)
    router.on_finish("a", 10)
    assert router.outstanding_requests == {"a": 1, "b": 0}
    assert router.outstanding_tokens == {"a": 5, "b": 0}
    assert router.load("a") == 1


# ---- LRU forgetting ----------------------------------------------------------------------------
def test_lru_forgets_the_least_recently_used_prefix_first():
    tree = PrefixTree(block_size=BS, max_tokens=4 * BS)  # room for 4 blocks
    x, y, z = (prefix_block_hashes(prompt(s, 2 * BS), BS) for s in (1, 2, 3))
    tree.insert(x)
    tree.insert(y)
    tree.insert(x)  # x used again: y is now the least recently used
    tree.insert(z)
    assert (tree.match_blocks(x), tree.match_blocks(y), tree.match_blocks(z)) == (2, 0, 2)
    assert tree.num_tokens == 4 * BS


def test_lru_evicts_the_end_of_a_prefix_before_its_beginning():
    tree = PrefixTree(block_size=BS, max_tokens=3 * BS)
    long = prefix_block_hashes(prompt(1, 3 * BS), BS)
    tree.insert(long)
    tree.insert(prefix_block_hashes(prompt(2, BS), BS))  # one block too many
    assert tree.match_blocks(long) == 2  # lost its last block, not its first


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=20), max_size=25),
       st.integers(1, 6))
def test_lru_bounds_size_and_never_orphans_a_block(prompts, max_blocks):
    tree = PrefixTree(block_size=2, max_tokens=2 * max_blocks)
    for p in prompts:  # tiny alphabet: prompts share prefixes often
        hashes = prefix_block_hashes(p, 2)
        tree.insert(hashes)
        assert len(tree.nodes) <= max_blocks
        assert all(parent is None or parent in tree.nodes for parent in tree.nodes.values())
        assert tree.match_blocks(hashes) == min(len(hashes), max_blocks)  # the newest stays whole


def test_router_trees_stay_within_their_bound():
    router = Router(["a", "b"], block_size=BS, max_tree_tokens=10 * BS)
    for seed in range(30):
        send(router, prompt(seed, 6 * BS))
    assert all(tree.num_tokens <= 10 * BS for tree in router.trees.values())


# ---- dead replicas -----------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "cache_aware"])
def test_a_dead_replica_is_never_chosen(policy):
    router = Router(WORKERS, policy=policy, block_size=BS)
    base = prompt(1, 32)
    home = send(router, base).worker
    router.mark_dead(home)
    for seed in range(20):  # including the prompt whose cache lived on the dead replica
        assert send(router, base + prompt(seed + 2, 8)).worker != home
    router.mark_alive(home)
    assert home in {send(router, prompt(50 + s, 8)).worker for s in range(8)}


def test_no_alive_replica_raises_a_clear_error():
    router = Router(["a", "b"])
    router.mark_dead("a")
    router.mark_dead("b")
    with pytest.raises(NoAliveWorkerError, match="all 2 workers are marked dead"):
        router.route([1, 2, 3])
    with pytest.raises(KeyError):
        router.mark_dead("c")


def test_a_dead_replicas_load_does_not_trigger_rebalancing():
    router = Router(["a", "b", "c"], block_size=BS, balance_abs_threshold=4)
    base = prompt(1, 32)
    home = send(router, base).worker
    dead = next(w for w in router.workers if w != home)
    router.report_load(dead, 100)
    router.mark_dead(dead)
    assert router.choose(base).reason == "cache_hit"


# ---- round-robin and least-loaded ------------------------------------------------------------------
def test_round_robin_cycles_and_skips_dead_replicas():
    router = Router(["a", "b", "c"], policy="round_robin")
    same = prompt(1, 32)  # the prompt does not matter to round-robin
    assert [router.route(same) for _ in range(7)] == list("abcabca")
    router.mark_dead("c")
    assert [router.route(same) for _ in range(4)] == list("baba")


def test_least_loaded_picks_the_smallest_load_and_breaks_ties_by_recency():
    router = Router(["a", "b", "c"], policy="least_loaded")
    assert [router.route([7]) for _ in range(3)] == list("abc")  # all idle: take turns
    for w, n in [("a", 3), ("b", 1), ("c", 2)]:
        router.report_load(w, n)
    assert router.route([7]) == "b"
    router.on_dispatch("b")
    router.on_dispatch("b")  # b now 3, c 2
    assert router.route([7]) == "c"


def test_least_loaded_by_tokens():
    router = Router(["a", "b"], policy="least_loaded", load_metric="tokens")
    router.on_dispatch("a", 100)
    router.on_dispatch("b", 10)
    router.on_dispatch("b", 10)  # more requests but fewer tokens
    assert router.route([1]) == "b"


# ---- statistics ----------------------------------------------------------------------------------
def test_prefix_hit_rate_is_matched_over_prompt_tokens():
    router = Router(["a", "b"], block_size=BS)
    base = prompt(1, 30)  # 7 full blocks = 28 tokens can match
    send(router, base)
    send(router, base)
    stats = router.stats
    assert (stats.requests, stats.prompt_tokens, stats.matched_tokens) == (2, 60, 28)
    assert stats.prefix_hit_rate == pytest.approx(28 / 60)
    assert stats.as_dict()["reasons"] == {"cache_miss": 1, "cache_hit": 1}
    assert sum(stats.per_worker.values()) == 2
    assert Router(["a"]).stats.prefix_hit_rate == 0.0


def test_round_robin_hit_rate_is_lower_than_cache_aware_on_shared_prefixes():
    rates = {}
    for policy in ("round_robin", "cache_aware"):
        router = Router(WORKERS, policy=policy, block_size=BS)
        for turn in range(3):
            for c in range(3):  # three conversations over four replicas, three turns each
                send(router, prompt(c, 32) + prompt(10 + turn, 8))
        rates[policy] = router.stats.prefix_hit_rate
    assert rates["cache_aware"] > rates["round_robin"]


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        Router(["a"], policy="random")
    with pytest.raises(ValueError, match="distinct"):
        Router(["a", "a"])
    with pytest.raises(ValueError, match="load_metric"):
        Router(["a"], load_metric="bytes")
