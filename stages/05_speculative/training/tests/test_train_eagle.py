"""The EAGLE trainer runs end to end on tiny models of two families, resumes its data and its
training where they stopped, and writes a head the drafter loads, with its held-out figures."""
import json
import re

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, Qwen3Config

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import TINY_EOS, byte_tokenizer, save_transformers_model, tiny_model
from course.s01_decode_loop.weights import load_model
from course.s02_kv_cache.generate import generate_cached
from course.s05_speculative.eagle import EagleDrafter, EagleHead
from course.s05_speculative.eagle3 import Eagle3Head
from course.s05_speculative.speculative import SpecStats, stream_speculative
from course.s05_speculative.training.eagle_data import read_jsonl
from course.s05_speculative.training.train_eagle import main as train_main


def common_args(folder, work, out):
    return ["--model", str(folder), "--prompts", "6", "--eval-prompts", "2", "--answer-tokens", "24",
            "--eval-answer-tokens", "6", "--max-prompt-tokens", "96", "--batch-tokens", "256",
            "--draft-vocab", "16", "--ttt-steps", "2", "--eval-k", "3", "--self-distill", "2",
            "--distill-prompt-tokens", "96", "--distill-answer-tokens", "8", "--work", str(work), "--out", str(out)]


@pytest.mark.slow
@pytest.mark.parametrize("head_kind", ["eagle", "eagle3"])
def test_train_eagle_runs_resumes_and_writes_a_loadable_head(chat_folder, tmp_path, capsys, head_kind):
    """A miniature run of the real script (ShareGPT conversations and two self-distilled answers, the
    tiny model): end to end, then resumed from its checkpoint for two more epochs without remaking
    its data; the head carries its draft vocabulary and its held-out figures, and --evaluate
    measures any head the same way."""
    out, work = tmp_path / "head.safetensors", tmp_path / "work"
    common = common_args(chat_folder, work, out) + ["--head", head_kind]
    assert train_main([*common, "--epochs", "1"]) == 0
    ckpt = work / f"ckpt_{head_kind}.pt"
    assert (work / "train.jsonl").read_text().count("\n") == 6 and ckpt.exists()
    assert (work / "eval.jsonl").read_text().count("\n") == 2
    distilled = read_jsonl(work / "distill.jsonl")
    assert len(distilled) == 2 and all(len(r["answer_ids"]) <= 8 for r in distilled)
    train_prompts = {tuple(json.loads(line)["prompt_ids"]) for line in (work / "train.jsonl").read_text().splitlines()}
    eval_prompts = {tuple(json.loads(line)["prompt_ids"]) for line in (work / "eval.jsonl").read_text().splitlines()}
    assert not train_prompts & eval_prompts  # held out means held out
    assert not {tuple(r["prompt_ids"]) for r in distilled} & eval_prompts
    first = torch.load(ckpt)["epoch"]
    shards = sorted((work).glob("train_features*/*.pt"))
    made = [p.stat().st_mtime_ns for p in shards]
    assert train_main([*common, "--epochs", "3"]) == 0  # resumes: samples and features reused
    assert torch.load(ckpt)["epoch"] == first + 2
    assert [p.stat().st_mtime_ns for p in shards] == made
    head = EagleHead.load(out, tiny_model("mha_untied"))
    assert type(head) is (Eagle3Head if head_kind == "eagle3" else EagleHead)
    assert head.draft_vocab.numel() == 16
    meta = safe_open(str(out), "pt").metadata()
    assert meta["head"] == head_kind
    assert 0.0 <= float(meta["heldout_top1"]) <= 1.0 and 1.0 <= float(meta["heldout_accepted_length_k3"]) <= 4.0
    capsys.readouterr()
    assert train_main([*common, "--evaluate", str(out)]) == 0
    printed = capsys.readouterr().out
    top1 = float(re.search(r"top1 ([0-9.]+),", printed).group(1))
    assert abs(top1 - float(meta["heldout_top1"])) < 6e-4 and "accepted_length_k3" in printed  # the shipped weights


def test_self_distillation_resumes_after_its_last_complete_chunk(chat_folder, tmp_path):
    """The data run stops anywhere (here: mid-line, as a kill leaves it) and goes on from its
    last complete answer, asking the same prompts in the same order; a file made for other
    prompts is refused instead of mixed in."""
    from course.s05_speculative.training.eagle_data import distill_answers

    loaded = load_model(str(chat_folder))
    prompts = [[65 + i, 66, 67, 10] for i in range(5)]
    path = tmp_path / "distill.jsonl"
    whole = distill_answers(loaded, prompts, tmp_path / "whole.jsonl", answer_tokens=4, chunk=2, batch=2)
    distill_answers(loaded, prompts[:3], path, answer_tokens=4, chunk=2, batch=2)
    with open(path, "a") as f:
        f.write('{"prompt_ids": [1, 2')  # a write cut short
    rows = distill_answers(loaded, prompts, path, answer_tokens=4, chunk=2, batch=2)
    assert rows == whole and read_jsonl(path) == whole
    with pytest.raises(ValueError, match="another prompt"):
        distill_answers(loaded, [[70, 71]] + prompts[1:], path, answer_tokens=4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_train_eagle3_on_a_model_folder_of_another_family(tmp_path, family):
    """The trainer takes any model folder the engine loads: tiny Llama and Qwen3 models saved by
    transformers itself train an EAGLE-3 head for a few steps (Qwen3's under bfloat16 autocast), and
    the head drafts for them."""
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    small = dict(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    config = LlamaConfig(**small) if family == "llama" else Qwen3Config(**small, head_dim=16)
    folder = tmp_path / family
    save_transformers_model(config, tokenizer, folder)
    out = tmp_path / "head.safetensors"
    assert train_main([*common_args(folder, tmp_path / "work", out), "--head", "eagle3", "--epochs", "1",
                       *(["--bf16"] if family == "qwen3" else [])]) == 0
    loaded = load_model(str(folder))
    head = EagleHead.load(out, loaded.model)
    assert head.tap_layers == (1, 2) and head.fuse.in_features == 2 * 64  # 4 layers: 2 = L/2 and L-3 = 1
    prompt = loaded.tokenizer.encode("hello there", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    seq, stats = Sequence(prompt, params, loaded.tokenizer), SpecStats()
    list(stream_speculative(loaded.model, seq, EagleDrafter(head, loaded.model), k=3, stats=stats))
    assert seq.output_ids == generate_cached(loaded.model, loaded.tokenizer, prompt, params).token_ids
    assert stats.proposed > 0


@pytest.mark.parametrize("name", ["gqa_tied", "mqa_odd_heads", "mha_untied"])
@pytest.mark.parametrize("num_blocks", [64, 26])
def test_batched_decode_attention_gives_the_lessons_answers(byte_tok, name, num_blocks):
    """The self-distillation engine attends all-decode steps over each request's dense copy of its
    K/V; its answers equal stage 04's engine's (stage 03's per-sequence loop): prompts of
    different lengths, some finishing early, more requests than rows (rows reused), prompts
    sharing cached blocks (a row filled from the pool), and with 26 blocks, preemption (a
    request returns to a row that missed its recomputed tokens)."""
    from course.s04_continuous_batching.engine import EngineConfig, LLMEngine
    from course.s05_speculative.training.batched_decode import BatchedDecodeAttention, DistillEngine

    model = tiny_model(name)
    cat = list(b"the cat sat on the mat, " * 3)
    prompts = [list(b"hello there"), list(b"a"), cat, list(b"0123"), cat + list(b"and"), list(b"xyz" * 5)]
    params = [SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True) for n in (20, 7, 20, 13, 16, 9)]
    config = EngineConfig(num_blocks=num_blocks, block_size=4, max_num_seqs=4, max_num_batched_tokens=32)
    want = LLMEngine(model, byte_tok, config, [TINY_EOS]).generate(prompts, params)
    engine = DistillEngine(model, byte_tok, config, [TINY_EOS])
    batched = []
    forward = BatchedDecodeAttention.forward
    engine.attn.forward = lambda layer, q, *a: (batched.append(q.shape[0]), forward(engine.attn, layer, q, *a))[1]
    got = engine.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert 4 in batched  # all-decode steps of the whole batch went through the batched path
    if num_blocks == 26:
        assert any(step["preempted"] for step in engine.step_log)
