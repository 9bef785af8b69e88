"""The EAGLE trainer runs end to end on a tiny model, resumes from its checkpoint and writes a
head the drafter loads, with its held-out figures."""
import json
import re

import pytest
import torch
from safetensors import safe_open

from course.s01_decode_loop.testing import tiny_model
from course.s05_speculative.eagle import EagleHead
from course.s05_speculative.training.train_eagle import main as train_main


@pytest.mark.slow
def test_train_eagle_runs_resumes_and_writes_a_loadable_head(chat_folder, tmp_path, capsys):
    """A miniature run of the real script (ShareGPT conversations and two self-distilled answers, the
    tiny model): end to end, then resumed from its checkpoint for two more epochs without remaking
    its data; the head carries its draft vocabulary and its held-out figures, and --evaluate
    measures any head the same way."""
    out, work = tmp_path / "head.safetensors", tmp_path / "work"
    common = ["--model", str(chat_folder), "--prompts", "6", "--eval-prompts", "2", "--answer-tokens", "24",
              "--eval-answer-tokens", "6", "--max-prompt-tokens", "96", "--batch-tokens", "256",
              "--draft-vocab", "16", "--ttt-steps", "2", "--eval-k", "3", "--self-distill", "2",
              "--work", str(work), "--out", str(out)]
    assert train_main([*common, "--epochs", "1"]) == 0
    assert (work / "train.jsonl").read_text().count("\n") == 6 and (work / "ckpt.pt").exists()
    assert (work / "eval.jsonl").read_text().count("\n") == 2
    assert (work / "distill.jsonl").read_text().count("\n") == 2 and (work / "distill_features.pt").exists()
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
