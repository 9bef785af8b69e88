"""Stage 03 keeps the CLI contract and reports cache statistics in its JSON."""
import json
import subprocess
import sys


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "course.s03_paged", *args], capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_json_reports_prefix_hits(tiny_folder):
    shared = "the same forty characters of preamble..."  # 40 bytes = 40 tokens: 2 full blocks of 16
    rc, out, err = run_cli("--model", str(tiny_folder), "--prompt", shared + "first", "--prompt", shared + "second",
                           "--max-new-tokens", "4", "--ignore-eos", "--json")
    assert rc == 0, err
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["stats"]["prefix_hit_tokens"] == 0
    assert second["stats"]["prefix_hit_tokens"] == 32
    assert second["stats"]["free_blocks"] == second["stats"]["num_blocks"]


def test_cli_refuses_a_request_bigger_than_the_pool(tiny_folder):
    rc, _, err = run_cli("--model", str(tiny_folder), "--prompt", "x" * 60, "--max-new-tokens", "10",
                         "--kv-blocks", "4")
    assert rc == 2 and "the pool has 4" in err
