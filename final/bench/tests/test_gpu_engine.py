"""The GPU engine benchmark's plumbing, on the CPU: its dry run steps every workload to the end,
times every step, overlap scheduling changes no token, and the oracle drafter is accepted whole
and changes no token."""
import json

from course.final.bench.gpu_engine import llama_config, main


def test_the_dry_run_measures_every_step_and_the_oracle_is_accepted_whole(tmp_path):
    out = tmp_path / "dry.json"
    result = main(["--dry-run", "--json", str(out)])
    assert json.loads(out.read_text())["command"]
    rows = {(r["workload"], r["streams"], r["system"]): r for r in result["rows"]}
    assert {w for w, _, _ in rows} == {"decode", "prefill", "speculation"}
    for row in result["rows"]:
        per_step = row["per_step"]
        assert row["steps"] == len(per_step["wall_ms"]) > 0
        assert row["tokens"] == row["streams"] * row["new_tokens"]  # every token counted once
        assert all(w >= d >= 0 for w, d in zip(per_step["wall_ms"], per_step["device_ms"]))
        assert row["graphed_steps"] == row["engine_graphed_steps"] == sum(per_step["graphed"])
    overlap = rows["decode", 4, "overlap"]
    assert overlap["same_tokens_as_sync"] and ("decode", 4, "sync") in rows
    for streams in (1, 2):
        oracle = rows["speculation", streams, "oracle k=4"]
        assert oracle["acceptance_rate"] == 1.0 and oracle["same_tokens_as_none"]
        assert oracle["steps"] < rows["speculation", streams, "none"]["steps"]


def test_the_shapes_are_the_real_models():
    one, eight = llama_config("1b"), llama_config("8b")
    assert (one.hidden_size, one.num_hidden_layers, one.intermediate_size) == (2048, 16, 8192)
    assert (eight.hidden_size, eight.num_hidden_layers, eight.num_attention_heads, eight.num_key_value_heads,
            eight.intermediate_size, eight.vocab_size) == (4096, 32, 32, 8, 14336, 128256)
