"""Stage 02 keeps the CLI contract, and refuses what its cache cannot hold."""
import json
import subprocess
import sys

from course.s01_decode_loop.cli import main as cli_main
from course.s02_kv_cache.generate import stream_cached


def test_cli_json_matches_stage01(tiny_folder):
    args = ["--model", str(tiny_folder), "--prompt", "abc", "--max-new-tokens", "6", "--ignore-eos", "--json",
            "--temperature", "0.8", "--seed", "3"]
    outs = {}
    for stage in ["course.s01_decode_loop", "course.s02_kv_cache"]:
        proc = subprocess.run([sys.executable, "-m", stage, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs[stage] = json.loads(proc.stdout)
    assert outs["course.s02_kv_cache"]["token_ids"] == outs["course.s01_decode_loop"]["token_ids"]


def test_cli_too_long_request_is_a_clear_error(tiny_folder, capsys):
    rc = cli_main(["--model", str(tiny_folder), "--prompt", "x" * 500, "--max-new-tokens", "100"],
                  stream_fn=stream_cached)
    assert rc == 2
    assert "exceeds the maximum sequence length of 512" in capsys.readouterr().err
