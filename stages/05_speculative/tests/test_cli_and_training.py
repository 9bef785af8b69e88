"""The stage CLI keeps the contract and reports acceptance; the EAGLE trainer runs and resumes."""
import json
import re

import pytest
import torch
from safetensors import safe_open

from course.s01_decode_loop.cli import main as stage01_main
from course.s01_decode_loop.testing import save_hf_folder, tiny_model
from course.s02_kv_cache.generate import stream_cached
from course.s05_speculative.cli import main
from course.s05_speculative.eagle import EagleHead
from course.s05_speculative.train_eagle import main as train_main

ARGS = ["--prompt", "hello hello hello", "--max-new-tokens", "12", "--ignore-eos", "--json"]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory, byte_tok):
    """A tiny model whose tokenizer has a chat template (the trainer formats prompts as chat)."""
    path = tmp_path_factory.mktemp("tiny_chat")
    byte_tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    save_hf_folder(tiny_model("mha_untied"), byte_tok, path)
    return path


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
                            "--draft-layers", "1", "--eagle-head", str(head), "--tree-nodes", "6"])
    assert out["token_ids"] == base["token_ids"]
    stats = out["stats"]
    assert stats["method"] == method and stats["proposed"] > 0
    assert stats["emitted"] == stats["accepted"] + stats["target_forwards"]
    assert 1.0 <= stats["mean_accepted_length"] <= 4.0 or method == "eagle-tree"


def test_cli_refuses_what_it_cannot_do(chat_folder, tmp_path, capsys):
    base = ["--model", str(chat_folder), "--prompt", "hi"]
    assert main([*base, "--method", "eagle", "--eagle-head", str(tmp_path / "none.safetensors")]) == 2
    assert "no EAGLE head" in capsys.readouterr().err
    assert main([*base, "--method", "lookup", "--k", "-1"]) == 2
    assert "--k must be >= 0" in capsys.readouterr().err
    assert main([*base, "--method", "eagle-tree", "--temperature", "0.7"]) == 2
    assert "greedy" in capsys.readouterr().err


@pytest.mark.slow
def test_train_eagle_runs_resumes_and_writes_a_loadable_head(chat_folder, tmp_path, capsys):
    """A miniature run of the real script (ShareGPT conversations, the tiny model): end to end, then
    resumed from its checkpoint for two more epochs without remaking its data; the head carries
    its draft vocabulary and its held-out figures, and --evaluate measures any head the same way."""
    out, work = tmp_path / "head.safetensors", tmp_path / "work"
    common = ["--model", str(chat_folder), "--prompts", "6", "--eval-prompts", "2", "--answer-tokens", "24",
              "--eval-answer-tokens", "6", "--max-prompt-tokens", "96", "--batch-tokens", "256",
              "--draft-vocab", "16", "--ttt-steps", "2", "--eval-k", "3", "--work", str(work), "--out", str(out)]
    assert train_main([*common, "--epochs", "1"]) == 0
    assert (work / "train.jsonl").read_text().count("\n") == 6 and (work / "ckpt.pt").exists()
    assert (work / "eval.jsonl").read_text().count("\n") == 2
    train_prompts = {tuple(json.loads(line)["prompt_ids"]) for line in (work / "train.jsonl").read_text().splitlines()}
    eval_prompts = {tuple(json.loads(line)["prompt_ids"]) for line in (work / "eval.jsonl").read_text().splitlines()}
    assert not train_prompts & eval_prompts  # held out means held out
    first = torch.load(work / "ckpt.pt")["epoch"]
    made = (work / "train_features.pt").stat().st_mtime_ns
    assert train_main([*common, "--epochs", "3"]) == 0  # resumes: samples and features reused
    assert torch.load(work / "ckpt.pt")["epoch"] == first + 2
    assert (work / "train_features.pt").stat().st_mtime_ns == made
    head = EagleHead.load(out, tiny_model("mha_untied"))
    assert head.draft_vocab.numel() == 16
    meta = safe_open(str(out), "pt").metadata()
    assert 0.0 <= float(meta["heldout_top1"]) <= 1.0 and 1.0 <= float(meta["heldout_accepted_length_k3"]) <= 4.0
    capsys.readouterr()
    assert train_main([*common, "--evaluate", str(out)]) == 0
    printed = capsys.readouterr().out
    top1 = float(re.search(r"top1 ([0-9.]+),", printed).group(1))
    assert abs(top1 - float(meta["heldout_top1"])) < 6e-4 and "accepted_length_k3" in printed  # the shipped weights
