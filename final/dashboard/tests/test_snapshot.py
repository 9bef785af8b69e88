"""Snapshots read from an engine in this process: their shape, the block states, the step clock
that only exists while someone watches, and the bounded queue of each watcher."""
import asyncio
import json

from course.s04_continuous_batching.watch.snapshot import MAX_CELLS, STATES, pool_json
from course.s04_continuous_batching.watch import EngineWatch
from course.final.engine import Engine, SpeculativeConfig
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s05_speculative.drafter import Draft, Drafter
from course.s06_kernels_graphs.engine import KernelEngineConfig


def small_engine(byte_tok, num_blocks=64, **config):
    return Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=num_blocks, block_size=4, **config),
                  [byte_tok.eos_token_id])


def every_turn() -> EngineWatch:
    """A watch that snapshots at every turn: no interval, no cost rule (tests must not depend on
    how fast this machine steps)."""
    return EngineWatch(min_interval_s=0, max_cost_share=float("inf"))


def params(n=12):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


class OpenPage:
    """A watcher as an open page is, on its own event loop."""

    def __init__(self, watch: EngineWatch):
        self.loop = asyncio.new_event_loop()
        self.watch, self.watcher = watch, watch.subscribe(self.loop)

    def snapshots(self) -> list[dict]:
        self.loop.run_until_complete(asyncio.sleep(0))  # deliver what the engine thread offered
        out = []
        while not self.watcher.queue.empty():
            out.append(json.loads(self.watcher.queue.get_nowait()))
        return out

    def close(self):
        self.watch.unsubscribe(self.watcher)
        self.loop.close()


def run(engine, watch, steps=None):
    while engine.has_unfinished() and (steps is None or steps > 0):
        engine.step()
        watch.turn(engine)
        steps = None if steps is None else steps - 1


def test_no_snapshot_and_no_clock_while_nobody_watches(byte_tok):
    engine, watch = small_engine(byte_tok), EngineWatch()
    step = engine.step
    for p in ([1, 2, 3, 4, 5], [6, 7, 8]):
        engine.add_request(p, params())
    run(engine, watch)
    assert watch.snapshots_built == 0 and watch.latest is None
    assert engine.step == step and "step" not in vars(engine) and "preempt" not in vars(engine.scheduler)


def test_the_clock_comes_with_a_page_and_goes_with_it(byte_tok):
    engine, watch = small_engine(byte_tok), every_turn()
    page = OpenPage(watch)
    engine.add_request(list(range(1, 12)), params(20))
    run(engine, watch, steps=1)  # installs the clock, snapshots the empty window
    assert {"step", "_schedule", "_run", "_postprocess"} <= vars(engine).keys()
    run(engine, watch, steps=3)
    snaps = page.snapshots()
    assert snaps and watch.snapshots_built >= 2
    page.close()
    watch.turn(engine)
    assert not {"step", "_schedule", "_run", "_postprocess", "_propose"} & vars(engine).keys()
    assert "preempt" not in vars(engine.scheduler)


def test_snapshot_shape_rows_and_series(byte_tok):
    engine, watch = small_engine(byte_tok), every_turn()
    page = OpenPage(watch)
    watch.turn(engine)
    long_prompt = list(range(1, 40))
    engine.add_request(long_prompt, params(30))
    engine.add_request([9, 8, 7], params(30))
    run(engine, watch, steps=4)
    snap = page.snapshots()[-1]
    assert {"time", "engine", "running", "num_running", "queues", "pool", "preempted_now", "totals",
            "series"} <= snap.keys()
    assert snap["num_running"] == 2 and {r["kind"] for r in snap["running"]} == {"decode"}
    row = snap["running"][0]
    assert {"id", "kind", "tokens", "drafted", "accepted", "grammar", "priority", "level", "prompt_tokens",
            "output_tokens", "blocks"} <= row.keys()
    assert row["tokens"] == 1 and row["grammar"] is False and row["level"] is None
    series = snap["series"]
    assert series["steps"] == 1 and series["step_ms"] > 0 and series["tokens_per_step"] == 2
    assert set(series["phases_ms"]) == {"schedule", "draft", "forward", "sample"}
    assert series["ttft_p50_ms"] > 0 and 0 < series["kv_usage"] < 1
    pool = snap["pool"]
    assert sum(pool["runs"][1::2]) == pool["cells"] == pool["num_blocks"] == 64
    assert sum(pool["counts"].values()) == 64 and pool["preempted_cells"] == [] and pool["counts"]["used"] == sum(r["blocks"] for r in snap["running"])
    page.close()


def test_a_prefill_chunk_shows_as_one(byte_tok):
    """A long prompt under a small token budget: its row is a prefill chunk of the whole budget."""
    engine, watch = small_engine(byte_tok, max_num_batched_tokens=16), every_turn()
    page = OpenPage(watch)
    watch.turn(engine)
    engine.add_request(list(range(1, 40)), params())
    run(engine, watch, steps=1)
    row = page.snapshots()[-1]["running"][0]
    assert row["kind"] == "prefill" and row["tokens"] == 16 and row["output_tokens"] == 0
    page.close()


def test_preempted_and_shared_blocks_are_marked(byte_tok):
    engine, watch = small_engine(byte_tok, num_blocks=12), every_turn()
    page = OpenPage(watch)
    watch.turn(engine)
    prefix = list(range(1, 17))  # four full blocks, shared by both requests through the prefix cache
    engine.add_request(prefix + [20], params(24))
    run(engine, watch, steps=2)
    engine.add_request(prefix + [21], params(24))
    run(engine, watch, steps=2)
    counts = json.loads(watch.latest[1])["pool"]["counts"]
    assert counts["shared"] == 4
    seen = []
    while engine.has_unfinished():
        run(engine, watch, steps=1)
        seen += page.snapshots()
    preempting = [s for s in seen if s["preempted_now"]]
    assert engine.scheduler.num_preemptions > 0 and preempting
    pool = preempting[0]["pool"]
    assert pool["counts"]["preempted"] == len(pool["preempted_cells"]) > 0 and preempting[0]["totals"]["preemptions"] > 0
    assert seen[-1]["num_running"] == 0 and seen[-1]["pool"]["counts"]["used"] == 0
    page.close()


def test_a_large_pool_is_drawn_in_bounded_cells():
    states = bytearray(10_000)
    states[5_000] = STATES.index("shared")
    pool = pool_json(states, preempted={9_999})
    assert pool["group"] == 3 and pool["cells"] <= MAX_CELLS and sum(pool["runs"][1::2]) == pool["cells"]
    assert pool["runs"] == [0, 5_000 // 3, 3, 1, 0, pool["cells"] - 5_000 // 3 - 1]
    assert pool["counts"] == {"free": 9_999, "cached": 0, "used": 0, "shared": 1, "preempted": 1}
    assert pool["preempted_cells"] == [9_999 // 3]


def test_a_slow_page_gets_the_newest_snapshots_never_a_backlog():
    watch = EngineWatch(queue_size=3)
    page = OpenPage(watch)
    for i in range(50):
        page.watcher.offer(str(i))
    assert page.snapshots() == [47, 48, 49]
    assert page.watcher.dropped == 47
    page.close()


def test_snapshots_keep_their_cost_under_the_share(byte_tok):
    """The next snapshot waits at least 1/share times what the last one cost."""
    engine, watch = small_engine(byte_tok), EngineWatch(min_interval_s=0, max_cost_share=1e-6)
    page = OpenPage(watch)
    for _ in range(5):
        watch.turn(engine)
    assert watch.snapshots_built == 1
    page.close()


class Oracle(Drafter):
    """Drafts the true greedy continuation, but its third guess in each draft is wrong."""
    name = "oracle"

    def __init__(self, truth: dict[tuple, list[int]]):
        self.truth = truth

    def propose(self, seq, k):
        future = self.truth[tuple(seq.prompt_ids)][len(seq.output_ids):][:k]
        return Draft([t if i != 2 else (t + 1) % 256 for i, t in enumerate(future)])


def test_rows_show_drafted_and_accepted_tokens(byte_tok):
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42]]
    plain = small_engine(byte_tok)
    truth = {tuple(p): out.token_ids for p, out in zip(prompts, plain.generate(prompts, params(16)))}
    engine = Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4),
                    [byte_tok.eos_token_id], SpeculativeConfig("lookup", 4), drafter=Oracle(truth))
    watch = every_turn()
    page = OpenPage(watch)
    watch.turn(engine)
    for p in prompts:
        engine.add_request(p, params(16))
    snaps = []
    while engine.has_unfinished():
        run(engine, watch, steps=1)
        snaps += page.snapshots()
    drafted = [r for s in snaps for r in s["running"] if r["drafted"]]
    assert drafted and all(r["tokens"] == r["drafted"] + 1 for r in drafted)
    assert {(r["drafted"], r["accepted"]) for r in drafted} >= {(4, 2)}  # two right, the third wrong
    assert all(r["accepted"] == min(r["drafted"], 2) for r in drafted)
    rates = [s["series"]["spec_acceptance"] for s in snaps if s["series"]["spec_acceptance"] is not None]
    assert rates and 0 < min(rates) and max(rates) <= 1
    assert [out.token_ids for out in (engine.requests[0].seq.output(), engine.requests[1].seq.output())] == \
        [truth[tuple(p)] for p in prompts]
    page.close()
