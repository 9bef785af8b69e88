"""The serving benchmark client against a live tiny server: it must count what it measures."""
import asyncio
import json

import pytest

from course.final.bench.serving import run
from course.final.bench.plot_serving import load_summaries, plot


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bench_serving_measures_every_token(server, endpoint):
    requests = [(f"prompt number {i}", n) for i, n in enumerate([3, 8, 5, 1, 6])]
    result = asyncio.run(run(server[0], requests, rate=50.0, endpoint=endpoint))
    s, per = result["summary"], result["requests"]
    assert s["completed"] == 5 and s["failed"] == 0
    for r, (_, n) in zip(per, requests):
        assert r["output_tokens"] == r["usage_tokens"] == n  # ignore_eos: exactly the asked length
        assert len(r["itl_s"]) == n - 1
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["e2e_s"] == pytest.approx(r["ttft_s"] + sum(r["itl_s"]))
    assert s["output_tokens"] == 23
    assert s["output_throughput"] == pytest.approx(23 / s["duration_s"])
    assert s["p50_ttft_s"] <= s["p99_ttft_s"]


def test_bench_serving_counts_refusals_as_failures_and_goes_on(server):
    requests = [("fine", 4), ("x" * 600, 4), ("also fine", 4)]  # the middle one is over the context
    s = asyncio.run(run(server[0], requests, rate=float("inf"), endpoint="completions"))["summary"]
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["errors"][0].startswith("HTTP 400") and "maximum context length" in s["errors"][0]


def test_plot_serving_writes_a_png(server, tmp_path):
    paths = []
    for rate in (20.0, 5.0):
        result = asyncio.run(run(server[0], [("a b c", 4), ("d e", 3)], rate=rate))
        paths.append(tmp_path / f"r{rate}.json")
        paths[-1].write_text(json.dumps(result))
    summaries = load_summaries([str(p) for p in paths])
    assert [s["request_rate"] for s in summaries] == [5.0, 20.0]
    plot(summaries, str(tmp_path / "serving.png"))
    assert (tmp_path / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_guidellm_data_replays_our_requests_and_times(tmp_path):
    from course.final.bench.serving import write_guidellm_data
    from course.s01_decode_loop.bench.workloads import arrival_times

    requests, times = [("a", 3), ("b c", 5)], arrival_times(2, 1.0, 0)
    write_guidellm_data(str(tmp_path / "d.jsonl"), requests, times)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert rows == [{"prompt": p, "output_tokens_count": n, "relative_timestamp": t}
                    for (p, n), t in zip(requests, times)]
