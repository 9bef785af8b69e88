"""The front's brain: choose the workers (router.py), send the request through them, read the
token stream, and survive a worker that dies.

Two topologies:
  * disaggregated: a prefill worker (chosen by the policy, cache-aware by default: prefix reuse
    saves prefill compute, and the prefill pool is where it happens), then a decode worker
    (least-loaded: a decode has no prefill to save, only a batch to join). The prefill worker's
    answer (first token, transfer parameters) goes to the decode worker, which streams.
  * replicas: N unified workers, each runs whole requests; the policy chooses one.
(vLLM's disaggregated-serving proxy does the first; sgl-router does the second.)

Every choice is reported to the router: on_dispatch when sent, on_finish when the worker is done
with it, also when it failed, so the loads the router balances stay true. If anything fails after
a prefill, the prefill worker is told to cancel, so its blocks are freed at once instead of at the
end of their lease.

Failover, exactly once. A worker whose connection breaks (refused, reset, closed mid-stream) is
marked dead in the router and the request is tried again on other workers, from its prefill. The
client must see one answer, with no token twice and none missing. We *replay*: the retry runs the
whole request again (same prompt, same sampling, same seed) and the tokens the client already has
are skipped by position, after checking that the replay produced the same ones. We chose this over
*resuming* (a new request with prompt + tokens so far as its prompt, for the tokens still missing)
because a replay is the very computation a unified engine does: the same token ids, the same
incremental detokenizer state (so no text is split or lost at the seam), the same stop-string
matching and, for sampling, the same random stream. Resuming would save re-decoding the tokens
already sent, but its detokenizer, stop strings and sampler would restart mid-answer. A sampled
request without a seed gets one here, before its first try, so that its replay is reproducible too.
"""
from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from .router import Router

# The worker is gone (or was never there): try another one. Timeouts are not here: a slow
# worker is not a dead one, and the workers' own deadlines end a request that hangs.
WORKER_GONE = (httpx.NetworkError, httpx.RemoteProtocolError)


class WorkerDied(RuntimeError):
    """A worker's connection broke while it had our request; it is now marked dead."""


class Dispatcher:
    def __init__(self, prefill_urls: list[str] = (), decode_urls: list[str] = (), timeout_s: float = 120.0, *,
                 replicas: list[str] = (), policy: str = "cache_aware", block_size: int = 16, max_attempts: int = 3,
                 router_options: dict | None = None):
        """Disaggregated: prefill_urls and decode_urls. Replicas: replicas (unified workers) only.
        `block_size` must be the workers' own, so the router's block hashes match their caches;
        `router_options` go to the policy's Router (max_tree_tokens: about a worker's pool size)."""
        disaggregated = bool(prefill_urls) and bool(decode_urls)
        if disaggregated == bool(replicas) or (replicas and (prefill_urls or decode_urls)):
            raise ValueError("give prefill and decode workers, or replicas, not both")
        self.prefill_urls, self.decode_urls, self.replicas = list(prefill_urls), list(decode_urls), list(replicas)
        self.policy, self.max_attempts = policy, max_attempts
        self.first = Router(self.replicas or self.prefill_urls, policy, block_size=block_size,  # the prefix-caching pool
                            **(router_options or {}))
        self.second = Router(self.decode_urls, "least_loaded", block_size=block_size) if self.decode_urls else None
        self._lock = threading.Lock()  # a Router is single-threaded bookkeeping; requests run on many threads
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    # ---- the public calls -----------------------------------------------------------------
    def generate(self, prompt_ids: list[int], sampling: dict, lease_s: float | None = None,
                 cancel: threading.Event | None = None) -> dict:
        """Run one request to the end; returns token_ids, text, finish_reason, kv, logprobs (None
        for a handed-over first token: the prefill worker sampled it) and route (where it ran)."""
        token_ids, logprobs, text, last = [], [], "", {}
        for last in self.stream(prompt_ids, sampling, lease_s, cancel):
            token_ids.append(last["token_id"])
            logprobs.append(last.get("logprob"))
            text += last["text"]
        return {"token_ids": token_ids, "text": text, "finish_reason": last.get("finish_reason") or "abort",
                "kv": last.get("kv"), "logprobs": logprobs, "route": last.get("route")}

    def stream(self, prompt_ids: list[int], sampling: dict, lease_s: float | None = None,
               cancel: threading.Event | None = None) -> Iterator[dict]:
        """Yield the request's token lines, each exactly once, whatever worker fails on the way
        (see the module doc). `cancel`: set it when the client goes away; the request then stops
        at its next step (and a finished prefill is cancelled before any decode starts)."""
        sampling = dict(sampling)
        if sampling.get("temperature", 1.0) > 0 and sampling.get("seed") is None:
            sampling["seed"] = random.getrandbits(63)  # so that a replay draws the same tokens
        sent: list[int] = []
        for attempt in range(1, self.max_attempts + 1):
            run = (self._replica(prompt_ids, sampling) if self.replicas
                   else self._disaggregated(prompt_ids, sampling, lease_s, cancel))
            try:
                for position, line in enumerate(run):
                    if position < len(sent):  # the client has this one already: check, skip
                        if line["token_id"] != sent[position]:
                            raise RuntimeError(f"the replay diverged at token {position}; not sending a second answer")
                        continue
                    if line.get("finish_reason"):
                        line["route"] = {**line.get("route", {}), "attempts": attempt}
                    sent.append(line["token_id"])
                    yield line
                    if cancel is not None and cancel.is_set():
                        return  # closing `run` closes its stream: the worker aborts the request
                return
            except WorkerDied:
                if attempt == self.max_attempts:
                    raise
            finally:
                run.close()

    # ---- one attempt --------------------------------------------------------------------------
    def _replica(self, prompt_ids: list[int], sampling: dict) -> Iterator[dict]:
        with self._use(self.first, prompt_ids, remember_output=True) as (url, output):
            for line in self._read(url, {"prompt_ids": prompt_ids, "sampling": sampling}):
                output.append(line["token_id"])
                if line.get("finish_reason"):
                    line["route"] = {"replica": url}
                yield line

    def _disaggregated(self, prompt_ids, sampling, lease_s, cancel) -> Iterator[dict]:
        body = {"prompt_ids": prompt_ids, "sampling": sampling, **({"lease_s": lease_s} if lease_s else {})}
        with self._use(self.first, prompt_ids) as (prefill_url, _):
            handoff = self._prefill(prefill_url, body)
        finished = False
        try:
            if cancel is not None and cancel.is_set():  # the client left while we prefilled:
                return                                  # the finally below frees the blocks now
            with self._use(self.second, prompt_ids) as (decode_url, _):
                transfer = handoff["kv_transfer_params"]
                for line in self._read(decode_url, {**body, "kv_transfer_params": transfer}):
                    if line.get("finish_reason"):
                        line["route"] = {"prefill": prefill_url, "decode": decode_url}
                    yield line
            finished = True
        finally:  # failed, cancelled or closed early: do not leave the blocks to their lease
            if not finished:  # (a no-op if the decode side had confirmed already)
                self._cancel(prefill_url, handoff["transfer_id"])

    # ---- the pieces -----------------------------------------------------------------------------
    @contextmanager
    def _use(self, router: Router, prompt_ids: list[int], remember_output: bool = False):
        """Choose a worker and report it busy; on leaving, report it done (success or not), and
        mark it dead if its connection broke. Yields (url, list to put the output tokens in)."""
        with self._lock:
            url = router.route(prompt_ids)
            router.on_dispatch(url, len(prompt_ids))
        output: list[int] = []
        try:
            yield url, output
        except WORKER_GONE as e:
            with self._lock:
                router.mark_dead(url)
            raise WorkerDied(f"{url} is gone: {e!r}") from e
        finally:  # a replica caches the answer too: the next chat turn starts with prompt + answer
            with self._lock:
                router.on_finish(url, len(prompt_ids), prompt_ids + output if remember_output and output else None)

    def _prefill(self, url: str, body: dict) -> dict:
        r = self.client.post(f"{url}/prefill", json=body)
        r.raise_for_status()
        return r.json()

    def _cancel(self, url: str, transfer_id: str) -> None:
        try:
            self.client.post(f"{url}/cancel", json={"transfer_id": transfer_id})
        except httpx.HTTPError:
            pass  # a dead prefill worker holds nothing any more

    def _read(self, url: str, body: dict) -> Iterator[dict]:
        """A worker's /generate stream, line by line; an error line raises."""
        with self.client.stream("POST", f"{url}/generate", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"{url} said {r.status_code}: {r.text}")
            for raw in r.iter_lines():
                line = json.loads(raw)
                if "error" in line:
                    raise RuntimeError(f"{url}: {line['error']}")
                yield line

    def decode(self, decode_url: str, prompt_ids: list[int], sampling: dict, transfer: dict) -> dict:
        """One decode worker's answer to a given handoff, no routing and no retry (the notebook and
        the tests use it to play a consumer by hand)."""
        lines = list(self._read(decode_url, {"prompt_ids": prompt_ids, "sampling": sampling,
                                             "kv_transfer_params": transfer}))
        return {"token_ids": [x["token_id"] for x in lines], "text": "".join(x["text"] for x in lines),
                "finish_reason": lines[-1].get("finish_reason"), "kv": lines[-1].get("kv"),
                "logprobs": [x.get("logprob") for x in lines]}

    def stats(self) -> dict:
        with self._lock:
            return {"policy": self.policy, "first": self.first.stats.as_dict(), "dead": sorted(
                self.first.dead | (self.second.dead if self.second else set()))}
