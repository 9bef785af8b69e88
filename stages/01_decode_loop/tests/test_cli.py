"""The CLI contract every stage follows: flags in, one JSON object per prompt out."""
import json
import subprocess
import sys

import pytest

from course.s01_decode_loop.cli import main


def test_cli_json_one_object_per_prompt(tiny_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\n\n" + json.dumps({"prompt": "second\nprompt"}) + "\n")
    rc = main(["--model", str(tiny_folder), "--prompt", "zero", "--prompts-file", str(prompts),
               "--max-new-tokens", "5", "--ignore-eos", "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == ["zero", "first prompt", "second\nprompt"]
    for r in rows:
        assert len(r["token_ids"]) == 5 and r["finish_reason"] == "length"
        assert {"text", "ttft_s", "tpot_s"} <= r.keys()


def test_cli_streams_text_without_json(tiny_folder, capsys):
    assert main(["--model", str(tiny_folder), "--prompt", "hi", "--max-new-tokens", "4", "--ignore-eos"]) == 0
    captured = capsys.readouterr()
    assert "4 tokens, finish=length" in captured.err


def test_cli_bad_values_are_clear_errors(tiny_folder, capsys):
    assert main(["--model", str(tiny_folder), "--prompt", "hi", "--top-p", "1.5"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["--model", "/definitely/not/here", "--prompt", "hi"]) == 2
    assert "No model at" in capsys.readouterr().err


def test_cli_runs_as_a_module(tiny_folder):
    """`python -m course.s01_decode_loop` is the documented entry point."""
    proc = subprocess.run([sys.executable, "-m", "course.s01_decode_loop", "--model", str(tiny_folder),
                           "--prompt", "abc", "--max-new-tokens", "3", "--ignore-eos", "--json",
                           "--temperature", "0.7", "--seed", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) == 3


@pytest.mark.slow
def test_cli_real_model_chat(smollm2, capsys):
    assert main(["--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "12", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert "Paris" in row["text"]
