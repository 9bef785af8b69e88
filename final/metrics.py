"""Prometheus metrics, named after vLLM's so existing dashboards and alerts work unchanged.

The engine thread reports to `ServerMetrics`: `request_finished` once per finished request
(latency histograms from its token timestamps) and `engine_updated` after every loop turn
(gauges and counters read from the engine's own statistics). The server exposes the registry
at `GET /metrics`. Each server owns its registry, so several servers (tests) can live in one
process.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_GAP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = registry = CollectorRegistry()
        labels, self.model = ["model_name"], model_name

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(model_name)

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=registry).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=registry).labels(model_name)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between consecutive tokens.",
                             TOKEN_GAP_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.")
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.")
        self.running = gauge("vllm:num_requests_running", "Requests holding KV blocks.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests queued (new or preempted).")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks held by requests (1 = full).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted for lack of KV blocks.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens of finished requests.")
        self._success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                                labels + ["finished_reason"], registry=registry)
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Draft proposals verified (one per request-step).")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens sent to verification.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Drafted tokens the target kept.")
        self._spec_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted drafts by position in the draft (0 = first).",
                                     labels + ["position"], registry=registry)
        self._seen = {"queries": 0, "hits": 0, "preemptions": 0, "drafts": 0, "draft_tokens": 0,
                      "accepted": 0}  # engine totals already counted
        self._seen_per_pos: list[int] = []

    def request_finished(self, request) -> None:
        """Record one request that ended ("stop", "length" or "abort")."""
        self._success.labels(self.model, request.finish_reason).inc()
        times, seq = request.seq.token_times, request.seq
        self.prompt_tokens.inc(len(seq.prompt_ids))
        self.generation_tokens.inc(len(seq.output_ids))
        if request.first_scheduled_time is not None:
            self.queue.observe(request.first_scheduled_time - request.arrival_time)
        if not times:
            return
        self.ttft.observe(times[0])
        self.e2e.observe(times[-1])
        for a, b in zip(times, times[1:]):
            self.itl.observe(b - a)

    def engine_updated(self, engine) -> None:
        """Refresh gauges and advance counters from the engine's running totals."""
        stats, blocks = engine.stats(), engine.blocks
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_usage.set(1 - stats["free_blocks"] / stats["num_blocks"])
        for key, total, counter in (("queries", blocks.prompt_tokens, self.prefix_queries),
                                    ("hits", blocks.prefix_hit_tokens, self.prefix_hits),
                                    ("preemptions", stats["preemptions"], self.preemptions)):
            counter.inc(total - self._seen[key])
            self._seen[key] = total
        spec = getattr(engine, "spec_stats", None)
        if spec is not None:
            for key, total, counter in (("drafts", spec.target_forwards, self.spec_drafts),
                                        ("draft_tokens", spec.proposed, self.spec_draft_tokens),
                                        ("accepted", spec.accepted, self.spec_accepted)):
                counter.inc(total - self._seen[key])
                self._seen[key] = total
            per_pos = engine.accepted_per_position
            self._seen_per_pos += [0] * (len(per_pos) - len(self._seen_per_pos))
            for pos, total in enumerate(per_pos):
                self._spec_per_pos.labels(self.model, str(pos)).inc(total - self._seen_per_pos[pos])
                self._seen_per_pos[pos] = total

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
