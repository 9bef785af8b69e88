"""Stage 04's CLI: every prompt submitted at once; the same tokens as stage 01 one by one."""
import json
import subprocess
import sys


def test_cli_runs_prompts_concurrently_with_stage01_results(tiny_folder, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond, longer prompt than the first one\nthird\n")
    args = ["--model", str(tiny_folder), "--prompts-file", str(prompts), "--max-new-tokens", "6", "--ignore-eos",
            "--json"]
    rows = {}
    for stage in ["course.s01_decode_loop", "course.s04_continuous_batching"]:
        proc = subprocess.run([sys.executable, "-m", stage, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        rows[stage] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["token_ids"] for r in rows["course.s04_continuous_batching"]] == \
        [r["token_ids"] for r in rows["course.s01_decode_loop"]]
    assert all("queue_s" in r for r in rows["course.s04_continuous_batching"])


def test_cli_refuses_what_cannot_fit(tiny_folder):
    proc = subprocess.run([sys.executable, "-m", "course.s04_continuous_batching", "--model", str(tiny_folder),
                           "--prompt", "x" * 100, "--kv-blocks", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "the pool has 4" in proc.stderr
