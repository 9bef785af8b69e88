"""Who is watching the engine, and when a snapshot is due.

    engine thread, every loop turn ──> EngineWatch.turn(engine)
        nobody watching:  remove the step clock if it is there; return (no other work)
        someone watching: step clock installed; every >= 0.2 s, and never more often than
                          keeps the snapshot's own cost under 2% of the engine thread, build
                          one snapshot, encode it once, hand it to every watcher; and at once
                          when the number of running requests changes, so a request shorter
                          than the interval is still seen
    each watcher (one per open page) ──> a bounded queue on the server's event loop: when the
        page reads slower than snapshots come, the oldest is dropped; the engine never waits

`turn` and `build_json` run on the engine thread only; `subscribe`/`unsubscribe` on any;
`snapshot_events` on the server's event loop; `read_snapshots` on the reader's side.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import AsyncIterator, Callable, Iterable, Iterator

from .snapshot import build_snapshot
from .step_clock import StepClock, StepWindow


class TooManyWatchersError(RuntimeError):
    """Every watcher slot is taken (the server answers 429)."""


class Watcher:
    """One open page: a bounded queue of encoded snapshots on its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int):
        self.loop, self.queue = loop, asyncio.Queue(maxsize=size)
        self.dropped = 0

    def offer(self, data: str) -> None:  # the engine thread: never blocks
        self.loop.call_soon_threadsafe(self._put, data)

    def _put(self, data: str) -> None:  # the event loop
        if self.queue.full():
            self.queue.get_nowait()  # a page that lags sees the newest state, not a backlog
            self.dropped += 1
        self.queue.put_nowait(data)


class EngineWatch:
    def __init__(self, min_interval_s: float = 0.2, max_cost_share: float = 0.02, queue_size: int = 4,
                 max_watchers: int = 32):
        self.min_interval_s, self.max_cost_share = min_interval_s, max_cost_share
        self.queue_size, self.max_watchers = queue_size, max_watchers
        self.snapshots_built = 0  # tests: stays 0 while nobody watches
        self.last_build_s = 0.0   # what the last snapshot cost the engine thread, encoding included
        self.window = StepWindow()
        self.latest: tuple[float, str] | None = None  # (monotonic time, JSON) of the last snapshot
        self._watchers: set[Watcher] = set()
        self._lock = threading.Lock()
        self._clock: StepClock | None = None
        self._due = 0.0
        self._running = 0  # running requests in the last snapshot
        self._spec_seen = (0, 0)

    @property
    def watching(self) -> int:
        return len(self._watchers)

    def subscribe(self, loop: asyncio.AbstractEventLoop) -> Watcher:
        with self._lock:
            if len(self._watchers) >= self.max_watchers:
                raise TooManyWatchersError(f"{self.max_watchers} dashboards are open already")
            watcher = Watcher(loop, self.queue_size)
            self._watchers.add(watcher)
            return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def turn(self, engine, refusals: int = 0) -> None:
        """Called by the engine thread after every loop turn (see the module doc)."""
        if not self._watchers:
            self.detach()
            return
        self.attach(engine)
        now, running = time.monotonic(), len(engine.scheduler.running)
        if now < self._due and running == self._running:
            return
        self._running = running
        data = self.build_json(engine, refusals)
        self._due = now + max(self.min_interval_s, self.last_build_s / self.max_cost_share)
        with self._lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            try:
                watcher.offer(data)
            except RuntimeError:  # its event loop is closed: the page is gone
                self.unsubscribe(watcher)

    def attach(self, engine) -> None:
        """Time the engine's steps from now on, for the snapshots to come (what `turn` does when
        a page opens; a notebook that builds its own snapshots calls it once)."""
        if self._clock is None:
            self.window = StepWindow()
            self._clock = StepClock(engine, self.window).install()

    def detach(self) -> None:
        """Stop timing: the engine's own methods again, nothing paid per step."""
        if self._clock is not None:
            self._clock.remove()
            self._clock = None

    def build_json(self, engine, refusals: int = 0) -> str:
        """One snapshot, encoded; the window starts again (engine thread)."""
        spec = getattr(engine, "spec_stats", None)
        delta = None
        if spec is not None:
            delta = (spec.proposed - self._spec_seen[0], spec.accepted - self._spec_seen[1])
            self._spec_seen = (spec.proposed, spec.accepted)
        started = time.perf_counter()
        snapshot = build_snapshot(engine, self.window, refusals, delta)
        snapshot["series"]["snapshot_ms"] = self.last_build_s * 1e3  # the previous one's cost (this one's is not known yet)
        data = json.dumps(snapshot, separators=(",", ":"))
        self.last_build_s = time.perf_counter() - started
        self.window.reset()
        self.snapshots_built += 1
        self.latest = (time.monotonic(), data)
        return data

    def recent(self, max_age_s: float = 1.0) -> str | None:
        """The last snapshot if it is fresh (a page is open), else None."""
        latest = self.latest
        return latest[1] if latest and time.monotonic() - latest[0] <= max_age_s else None


def may_join(watch: EngineWatch) -> bool:
    """May one more reader open the event stream? (When not, a server answers 429.)"""
    return watch.watching < watch.max_watchers


async def snapshot_events(watch: EngineWatch, alive: Callable[[], bool],
                          keep_alive_s: float = 1.0) -> AsyncIterator[str]:
    """Server-sent events for one reader: `data: SNAPSHOT` as they come, `: idle` comments while
    none does (so a gone client is noticed at the next write), until `alive()` turns false.
    Subscribed inside the generator, so whatever ends it (the client leaving too) unsubscribes."""
    try:
        watcher = watch.subscribe(asyncio.get_running_loop())
    except TooManyWatchersError:
        return
    try:
        while alive():
            try:
                data = await asyncio.wait_for(watcher.queue.get(), keep_alive_s)
            except asyncio.TimeoutError:
                yield ": idle\n\n"
                continue
            yield f"data: {data}\n\n"
    finally:
        watch.unsubscribe(watcher)


def read_snapshots(lines: Iterable[str]) -> Iterator[dict]:
    """The reader's side of snapshot_events: each `data:` line of the stream, decoded, as it comes
    (keep-alive comments and blank lines are skipped)."""
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])
