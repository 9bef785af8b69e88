"""The dashboard's routes on a live tiny server: /v1/engine/state, the event stream (bounded,
closed when the client leaves), the flag that turns them off, the API key, the fuzzer."""
import asyncio
import threading
import time

import httpx
from course.final.security.api_key import Door
from course.final.stress.fuzz import run_fuzz
from course.final.testing import live_server, running_server, start_cli_server, stop_cli_server, tiny_engine
from course.s04_continuous_batching.watch import read_snapshots

ROUTES = ("/dashboard", "/dashboard/dashboard.js", "/dashboard/events", "/v1/engine/state")


def read_events(url: str, count: int, headers=None) -> list[dict]:
    """The first `count` snapshots of the event stream; the connection is closed after them."""
    out = []
    with httpx.stream("GET", url + "/dashboard/events", headers=headers, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for snapshot in read_snapshots(r.iter_lines()):
            out.append(snapshot)
            if len(out) == count:
                break
    return out


def wait_until(predicate, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_state_is_built_on_demand_and_nothing_without_a_page(byte_tok):
    engine = tiny_engine(byte_tok)
    with live_server(engine, byte_tok) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 8})
        assert r.status_code == 200
        assert engine.watch.snapshots_built == 0 and "step" not in vars(engine.engine)
        state = httpx.get(url + "/v1/engine/state").json()
        assert engine.watch.snapshots_built == 1
        assert state["num_running"] == 0 and state["pool"]["num_blocks"] == 64
        assert state["engine"]["policy"] == "FCFS" and state["queues"]["waiting"] == {"count": 0, "ids": []}
        for _ in range(20):  # polling gets the snapshot of the last second, not a new one each time
            assert httpx.get(url + "/v1/engine/state").status_code == 200
        assert engine.watch.snapshots_built <= 3


def test_the_page_and_its_script_are_served(byte_tok):
    with live_server(tiny_engine(byte_tok), byte_tok) as url:
        page = httpx.get(url + "/dashboard")
        script = httpx.get(url + "/dashboard/dashboard.js")
        workers = httpx.get(url + "/dashboard/workers").json()
        picked = [httpx.get(url + route + "?worker=decode-0") for route in ("/v1/engine/state", "/dashboard/events")]
    assert workers == {"workers": []}  # one engine: the page shows no worker picker
    assert [r.status_code for r in picked] == [404, 404] and "no workers" in picked[0].json()["error"]["message"]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/dashboard/dashboard.js">' in page.text
    assert script.status_code == 200 and "EventSource" in script.text


def test_events_stream_snapshots_and_stop_when_the_client_leaves(byte_tok):
    engine = tiny_engine(byte_tok)
    with live_server(engine, byte_tok) as url:
        snaps = read_events(url, 3)
        assert [set(s) for s in snaps] == [set(snaps[0])] * 3 and snaps[0]["pool"]["num_blocks"] == 64
        assert snaps[1]["time"] > snaps[0]["time"]
        assert wait_until(lambda: engine.watch.watching == 0)  # the client left: unsubscribed
        assert wait_until(lambda: "step" not in vars(engine.engine))  # and the step clock is gone
        built = engine.watch.snapshots_built
        time.sleep(0.5)
        assert engine.watch.snapshots_built == built


def test_events_are_bounded_per_client_and_in_number_of_clients(byte_tok):
    engine = tiny_engine(byte_tok)
    with live_server(engine, byte_tok) as url:
        engine.watch.max_watchers = 1
        with httpx.stream("GET", url + "/dashboard/events", timeout=10) as slow:  # opened, never read
            assert slow.status_code == 200
            assert wait_until(lambda: engine.watch.watching == 1)
            watcher = next(iter(engine.watch._watchers))
            assert httpx.get(url + "/dashboard/events").status_code == 429
            time.sleep(1.5)  # ~7 snapshots offered to a page that reads none
            assert watcher.queue.qsize() <= engine.watch.queue_size
        assert wait_until(lambda: engine.watch.watching == 0)


def test_the_stream_ends_when_the_server_shuts_down(byte_tok):
    engine = tiny_engine(byte_tok)
    with running_server(engine, byte_tok) as (url, server):
        with httpx.stream("GET", url + "/dashboard/events", timeout=10) as r:
            lines = r.iter_lines()
            next(read_snapshots(lines))
            engine.accepting = False  # what a SIGTERM's drain does first
            rest = []
            for line in lines:  # ends: the server closes the stream within a second or two
                rest.append(line)
                assert len(rest) < 20, "the stream went on after the shutdown began"
        assert wait_until(lambda: engine.watch.watching == 0)


def test_no_dashboard_flag_gives_404(tiny_folder):
    proc, url = start_cli_server("--model", str(tiny_folder), "--kv-memory", "1MiB", "--no-dashboard")
    try:
        assert [httpx.get(url + route).status_code for route in ROUTES] == [404] * 4
        assert httpx.get(url + "/health").status_code == 200
    finally:
        assert stop_cli_server(proc) == 0


def test_the_dashboard_data_is_behind_the_api_key_and_its_page_is_not(byte_tok):
    """The page and its script hold no data and must load to ask for the key; the state and the
    stream need it."""
    key = {"authorization": "Bearer sk-dash"}
    with running_server(tiny_engine(byte_tok), byte_tok, door=Door(("sk-dash",))) as (url, _):
        assert [httpx.get(url + route).status_code for route in ("/v1/engine/state", "/dashboard/events")] == [401] * 2
        assert [httpx.get(url + route).status_code for route in ("/dashboard", "/dashboard/dashboard.js")] == [200] * 2
        assert httpx.get(url + "/v1/engine/state", headers=key).json()["pool"]["num_blocks"] == 64
        assert read_events(url, 1, headers=key)


def test_fuzz_with_a_page_open_never_5xx(byte_tok):
    engine = tiny_engine(byte_tok, max_waiting=8)
    with live_server(engine, byte_tok) as url:
        stop, seen = threading.Event(), []

        def watch_page():
            with httpx.stream("GET", url + "/dashboard/events", timeout=30) as r:
                for line in r.iter_lines():
                    seen.append(line)
                    if stop.is_set():
                        return
        page = threading.Thread(target=watch_page, daemon=True)
        page.start()
        assert wait_until(lambda: engine.watch.watching == 1)
        report = run_fuzz(url, cases=40, seed=7, deadline_s=60)
        statuses = [httpx.get(url + route).status_code for route in ("/dashboard", "/v1/engine/state")]
        stop.set()
        page.join(timeout=5)
    assert report.ok(), report.summary() + "\n" + "\n".join(report.violations[:20])
    assert statuses == [200, 200] and engine.watch.snapshots_built > 3
    assert any(line.startswith("data: ") for line in seen)


def test_overhead_bench_runs_the_load_with_the_page_closed_then_open(byte_tok):
    from course.final.dashboard.overhead import print_overhead, side_by_side
    engine = tiny_engine(byte_tok)
    with live_server(engine, byte_tok) as url:
        result = asyncio.run(side_by_side(url, [("hello there", 24)] * 4, float("inf"), watchers=2, rounds=1,
                                          endpoint="completions"))
    r = result["rounds"][0]
    assert r["closed"]["completed"] == r["open"]["completed"] == 4 and r["snapshots"] > 0
    assert result["overhead"]["output_throughput_open_over_closed"] > 0
    print_overhead(result)
