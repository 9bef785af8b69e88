"""The stage CLI keeps the contract, reports acceptance and refuses what it cannot do."""
import json

import pytest
import torch

from course.s01_decode_loop.cli import main as stage01_main
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.generate import stream_cached
from course.s05_speculative.cli import main
from course.s05_speculative.eagle import EagleHead

ARGS = ["--prompt", "hello hello hello", "--max-new-tokens", "12", "--ignore-eos", "--json"]


def run_json(capsys, argv, **kw):
    assert (main(argv) if not kw else stage01_main(argv, **kw)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["lookup", "draft", "eagle", "eagle-tree"])
def test_cli_every_method_matches_stage02_and_reports_acceptance(chat_folder, tmp_path, capsys, method):
    head = tmp_path / "head.safetensors"
    torch.manual_seed(0)
    EagleHead(tiny_model("mha_untied").config).save(head)
    base = run_json(capsys, ["--model", str(chat_folder), *ARGS], stream_fn=stream_cached)
    out = run_json(capsys, ["--model", str(chat_folder), *ARGS, "--method", method, "--k", "3",
                            "--draft-layers", "1", "--eagle-head", str(head), "--tree-nodes", "6",
                            "--tree-size", "fixed"])  # an untrained head's nodes never pay: cost would keep none
    assert out["token_ids"] == base["token_ids"]
    stats = out["stats"]
    assert stats["method"] == method and stats["proposed"] > 0
    assert stats["emitted"] == stats["accepted"] + stats["target_forwards"]
    assert 1.0 <= stats["mean_accepted_length"] <= 4.0 or method == "eagle-tree"
    if method == "eagle-tree":
        assert stats["tree"]["sized_by"] == "fixed"
        sized = run_json(capsys, ["--model", str(chat_folder), *ARGS, "--method", method, "--eagle-head", str(head)])
        assert sized["token_ids"] == base["token_ids"] and sized["stats"]["tree"]["sized_by"] == "cost"


def test_cli_refuses_what_it_cannot_do(chat_folder, tmp_path, capsys):
    base = ["--model", str(chat_folder), "--prompt", "hi"]
    assert main([*base, "--method", "eagle", "--eagle-head", str(tmp_path / "none.safetensors")]) == 2
    assert "no EAGLE head" in capsys.readouterr().err
    assert main([*base, "--method", "lookup", "--k", "-1"]) == 2
    assert "--k must be >= 0" in capsys.readouterr().err
    assert main([*base, "--method", "eagle-tree", "--temperature", "0.7"]) == 2
    assert "greedy" in capsys.readouterr().err
