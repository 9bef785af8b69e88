"""The benchmark runs end to end (quick mode, tiny model) and reports what the README's table shows.
It checks the report's shape and the facts that do not depend on timing, never a speed."""
import json

from course.s07_disaggregated.bench.benchmark import main


def test_benchmark_quick_runs_and_reports(untied_folder, tmp_path, capsys):
    out = tmp_path / "bench.json"
    report = main(["--model", str(untied_folder), "--quick", "--json", str(out)])
    assert {"command", "machine"} <= set(json.loads(out.read_text()))  # stamped by the harness
    a, b = report["a"], report["b"]
    assert set(a) == {"unified", "disaggregated"} and set(b) == {"cache_aware", "round_robin"}
    for row in [*a.values(), *b.values()]:
        assert row["requests"] > 0 and 0 < row["ttft_p50_s"] <= row["ttft_p99_s"]
    assert a["disaggregated"]["kv_bytes_mean"] > 0 and "kv_bytes_mean" not in a["unified"]
    # same workload, same order: affinity keeps each system prompt on one replica, round-robin does not
    assert b["cache_aware"]["router_prefix_hit_rate"] > b["round_robin"]["router_prefix_hit_rate"]
    assert all(0 <= r["engine_prefix_hit_rate"] <= 1 for r in b.values())
    assert "(b)" in capsys.readouterr().out
