"""The page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by selenium) loads /dashboard from a live tiny server under a short load. Rows must
appear and leave, the pool grid change, a preemption (a pool too small for the load) show, the
page must keep up at 64 running requests and 1,024 blocks, and no JS error may reach the
console. A screenshot is saved in the test's tmp folder, and to $DASHBOARD_SCREENSHOT if set.
Skipped only where no chromium and chromedriver are found."""
import asyncio
import os
import shutil
import threading
import time

import httpx
import pytest

from course.final.dashboard.testing import PAGE_STATE, chromium, console_errors
from course.final.security.api_key import Door
from course.final.testing import live_server, running_server, tiny_engine

pytestmark = pytest.mark.browser

@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


def load(url: str, concurrency: int, seconds: float, prompt: str, max_tokens: int, headers=None) -> threading.Thread:
    """`concurrency` clients, each sending one completion after another for `seconds`."""
    async def client(http: httpx.AsyncClient, end: float):
        while time.monotonic() < end:
            r = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                         "ignore_eos": True})
            assert r.status_code == 200, r.text

    async def clients():
        end = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:
            await asyncio.gather(*(client(http, end) for _ in range(concurrency)))
    thread = threading.Thread(target=asyncio.run, args=(clients(),), daemon=True)
    thread.start()
    return thread


def watch_page(driver, engine, traffic: threading.Thread, on_state=lambda states: None) -> list[dict]:
    """The page's state every ~0.1 s while the traffic lasts, then until the engine is idle and
    the page shows no row (at most 10 s more)."""
    states = []
    while traffic.is_alive():
        states.append(driver.execute_script(PAGE_STATE))
        on_state(states)
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states.append(driver.execute_script(PAGE_STATE))
        if states[-1]["rows"] == 0 and engine.call(lambda e: not e.has_unfinished()):
            break
        time.sleep(0.1)
    return states


def save_screenshot(driver, tmp_path):
    path = tmp_path / "dashboard.png"
    driver.save_screenshot(str(path))
    if os.environ.get("DASHBOARD_SCREENSHOT"):
        shutil.copyfile(path, os.environ["DASHBOARD_SCREENSHOT"])
    return path


def open_page(driver, url: str, engine) -> None:
    driver.get(url + "/dashboard")
    deadline = time.monotonic() + 10
    while engine.watch.watching == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.watch.watching == 1, "the page never opened its event stream"


def test_page_shows_rows_come_and_go_the_pool_change_and_a_preemption(browser, byte_tok, tmp_path):
    # 16 blocks of 4 tokens for 6 requests of ~50 tokens each: the pool runs out, requests are preempted
    engine = tiny_engine(byte_tok, num_blocks=16, max_num_seqs=6, max_waiting=64)
    shot = []

    def screenshot_mid_load(states):  # rows on screen, a preemption flashing, the charts filled a little
        if not shot and len(states) > 20 and states[-1]["rows"] >= 3 and states[-1]["flash"]:
            shot.append(save_screenshot(browser, tmp_path))

    with live_server(engine, byte_tok) as url:
        open_page(browser, url, engine)
        traffic = load(url, concurrency=6, seconds=4, prompt="the pool is small", max_tokens=32)
        states = watch_page(browser, engine, traffic, screenshot_mid_load)
        if not shot:
            save_screenshot(browser, tmp_path)
        errors = console_errors(browser)
    assert max(s["rows"] for s in states) >= 2, "no running request ever shown"
    assert states[-1]["rows"] == 0, "rows did not leave when the requests finished"
    assert len({s["grid"] for s in states}) >= 3, "the pool grid never changed"
    assert engine.engine.scheduler.num_preemptions > 0
    assert any("preemption: request #" in s["preemption"] for s in states), "no preemption shown"
    assert int(states[-1]["preemptions"]) > 0 and states[-1]["status"] == "live"
    assert not errors, errors
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_page_keeps_up_with_64_running_requests_and_1024_blocks(browser, byte_tok):
    """Keeping up is counted, not timed: the page draws the snapshots the server sends it, and
    the server drops (almost) none for a page that lags (a busy machine slows both alike)."""
    engine = tiny_engine(byte_tok, num_blocks=1024, max_num_seqs=64, max_waiting=128)
    with live_server(engine, byte_tok) as url:
        open_page(browser, url, engine)
        (watcher,) = engine.watch._watchers  # the page's queue on the server
        traffic = load(url, concurrency=64, seconds=5, prompt="a wide batch of requests", max_tokens=48)
        states = watch_page(browser, engine, traffic)
        errors = console_errors(browser)
        built = engine.watch.snapshots_built
    busy = [s for s in states if s["rows"] >= 32]
    assert busy, f"the batch never reached 32 rows (max {max(s['rows'] for s in states)})"
    assert busy[-1]["rendered"] - busy[0]["rendered"] >= 3, "the page stopped drawing under the wide batch"
    assert watcher.dropped <= built // 10, f"{watcher.dropped} of {built} snapshots dropped: the page fell behind"
    assert states[-1]["rendered"] + watcher.dropped >= built - 4  # at most a queue's worth still on its way
    assert not errors, errors


def test_a_keyed_server_page_asks_for_the_key_then_shows_the_engine(browser, byte_tok):
    """With --api-key the page still loads, finds its stream refused, asks for the key, and with
    it reads the stream (sent in a header, which EventSource could not do)."""
    engine = tiny_engine(byte_tok, max_waiting=16)
    with running_server(engine, byte_tok, door=Door(("sk-dash",))) as (url, _):
        browser.get(url + "/dashboard")
        deadline = time.monotonic() + 10
        while not browser.find_element("id", "key-form").is_displayed() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "API key" in browser.find_element("id", "status").text and engine.watch.watching == 0
        browser.find_element("id", "key").send_keys("sk-dash")
        browser.find_element("css selector", "#key-form button").click()
        while engine.watch.watching == 0 and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert engine.watch.watching == 1, "the page never opened its stream with the key"
        traffic = load(url, concurrency=4, seconds=2, prompt="behind a key", max_tokens=16,
                       headers={"authorization": "Bearer sk-dash"})
        states = watch_page(browser, engine, traffic)
        errors = [e for e in console_errors(browser) if "401" not in e]  # the first read, before the key
    assert max(s["rows"] for s in states) >= 1 and states[-1]["status"] == "live"
    assert not browser.find_element("id", "key-form").is_displayed()
    assert not errors, errors
