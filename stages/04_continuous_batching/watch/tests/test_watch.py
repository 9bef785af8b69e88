"""Snapshots of this stage's engine: nothing is built or timed while nobody watches; with a reader,
the rows, the pool and a preemption show, the event stream ends cleanly when its reader leaves,
and an HTTP app serves the snapshots through the watch's routes."""
import asyncio
import json

from fastapi import FastAPI
from fastapi.testclient import TestClient

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
from course.s04_continuous_batching.watch import EngineWatch, read_snapshots, snapshot_events
from course.s04_continuous_batching.watch.routes import add_watch_routes

PHASES = {"step", "_schedule", "_run", "_postprocess"}


def engine_of(byte_tok, num_blocks=64):
    return LLMEngine(tiny_model("gqa_tied"), byte_tok, EngineConfig(num_blocks=num_blocks, block_size=4))


def params(n=12):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def steps_watched(engine, watch, loop, reader) -> list[dict]:
    """Step `engine` to the end, the watch turning after each step; the snapshots `reader` got."""
    snaps = []
    while engine.has_unfinished():
        engine.step()
        watch.turn(engine)
        loop.run_until_complete(asyncio.sleep(0))
        while not reader.queue.empty():
            snaps.append(json.loads(reader.queue.get_nowait()))
    return snaps


def test_nobody_watching_costs_nothing(byte_tok):
    engine, watch = engine_of(byte_tok), EngineWatch()
    engine.add_request([1, 2, 3, 4, 5], params())
    while engine.has_unfinished():
        engine.step()
        watch.turn(engine)
    assert watch.snapshots_built == 0 and not PHASES & vars(engine).keys()


def test_a_reader_sees_rows_the_pool_and_a_preemption_and_the_clock_goes_with_it(byte_tok):
    engine, watch = engine_of(byte_tok, num_blocks=12), EngineWatch(min_interval_s=0, max_cost_share=float("inf"))
    loop = asyncio.new_event_loop()
    reader = watch.subscribe(loop)
    watch.turn(engine)
    assert PHASES <= vars(engine).keys()  # the clock is on while someone reads
    for tail in (20, 21):
        engine.add_request(list(range(1, 17)) + [tail], params(24))
    snaps = steps_watched(engine, watch, loop, reader)
    busy = next(s for s in snaps if s["num_running"] == 2)
    assert {r["kind"] for r in busy["running"]} <= {"prefill", "decode"}
    assert busy["pool"]["counts"]["used"] + busy["pool"]["counts"]["shared"] > 0
    assert engine.scheduler.num_preemptions > 0 and any(s["preempted_now"] for s in snaps)
    assert snaps[-1]["num_running"] == 0 and snaps[-1]["pool"]["counts"]["used"] == 0
    watch.unsubscribe(reader)
    watch.turn(engine)
    assert not PHASES & vars(engine).keys()
    loop.close()


def test_the_event_stream_sends_snapshots_and_unsubscribes_when_closed(byte_tok):
    engine, watch = engine_of(byte_tok), EngineWatch(min_interval_s=0, max_cost_share=float("inf"))

    async def read_two():
        events = snapshot_events(watch, lambda: True, keep_alive_s=0.05)
        first = await anext(events)  # nothing built yet: a keep-alive comment
        watch.turn(engine)           # the engine thread's turn: one snapshot for the reader
        second = await anext(events)
        await events.aclose()        # the client left
        return first, second

    first, second = asyncio.run(read_two())
    assert first == ": idle\n\n" and second.startswith("data: {")
    assert json.loads(second[len("data: "):])["engine"]["num_blocks"] == 64
    assert watch.watching == 0


def test_the_routes_serve_snapshots_and_refuse_a_reader_past_the_limit(byte_tok):
    engine = engine_of(byte_tok)
    watch = EngineWatch(min_interval_s=0, max_cost_share=float("inf"), max_watchers=1)
    turns = []

    def alive():  # the engine takes one turn while the reader is there, then the server stops
        if not turns:
            turns.append(watch.turn(engine))
            return True
        return False

    async def on_engine(fn):
        return fn(engine)

    app = FastAPI()
    add_watch_routes(app, watch, on_engine, alive)
    client = TestClient(app)
    assert client.get("/state").json()["engine"]["num_blocks"] == 64  # built on demand: nobody reads
    r = client.get("/events")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    (snapshot,) = read_snapshots(r.text.splitlines())
    assert snapshot["engine"]["num_blocks"] == 64 and watch.watching == 0
    watch.max_watchers = 0  # every reader slot taken
    assert client.get("/events").status_code == 429


def test_a_model_with_layer_groups_shows_its_full_layers_pool(byte_tok):
    """Sliding layers beside a full one (two layer groups): the watch draws the full group's pool."""
    from course.s01_decode_loop.testing import windowed_model

    engine = LLMEngine(windowed_model(6, every_layer=False), byte_tok,
                       EngineConfig(num_blocks=32, block_size=4, max_num_seqs=2))
    watch = EngineWatch(min_interval_s=0, max_cost_share=float("inf"))
    loop = asyncio.new_event_loop()
    reader = watch.subscribe(loop)
    watch.turn(engine)
    engine.add_request(list(range(1, 30)), params(20))
    snaps = steps_watched(engine, watch, loop, reader)
    watch.unsubscribe(reader)
    loop.close()
    assert max(s["pool"]["counts"]["used"] for s in snaps) == -(-(29 + 19) // 4)  # every block: the full layer's
    assert snaps[-1]["pool"]["counts"]["used"] == 0
