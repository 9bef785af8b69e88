"""Train the EAGLE head by self-distillation: the target writes the answers, the head learns
to predict the target's next feature (and so its next token).

    python -m course.s05_speculative.train_eagle            # ~1 h on 2 CPU cores, minutes on a GPU

Steps, each saved in --work so an interrupted run resumes where it stopped:
  1. answers.jsonl  ShareGPT first-turn prompts (chat template), the target's greedy answers
  2. features.pt    the target's final hidden states over prompt + answer, per sample
  3. ckpt.pt        head + optimizer after every epoch
and at the end the head (bfloat16 safetensors) at --out, with its held-out top-1 accuracy
(how often the head's next token equals the target's) in the file's metadata.

Loss, as in the EAGLE paper: SmoothL1 between predicted and true next feature, plus 0.1 x the
cross-entropy between the target's next-token distribution and the head's (both through the
target's frozen lm_head). Only positions inside the answer count.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.workloads import sample_requests
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

from .eagle import DEFAULT_HEAD, EagleHead

CLS_WEIGHT = 0.1  # the EAGLE paper's w_cls


def generate_answers(loaded, prompts: list[str], answer_tokens: int, path: Path, batch: int = 32) -> list[dict]:
    """The target's greedy answers, appended to `path` batch by batch (resumable)."""
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(num_blocks=4096, max_num_seqs=batch,
                                                                     max_num_batched_tokens=1024, record_steps=False),
                       loaded.eos_token_ids)
    params = SamplingParams(max_new_tokens=answer_tokens, temperature=0)
    with tqdm(total=len(prompts), initial=len(done), desc="1/3 target answers", unit="prompt") as bar:
        for i in range(len(done), len(prompts), batch):
            ids = [encode_prompt(loaded.tokenizer, p, chat=True) for p in prompts[i:i + batch]]
            outs = engine.generate(ids, params)
            with path.open("a") as f:
                for p, o in zip(ids, outs):
                    row = {"prompt_ids": p, "answer_ids": o.token_ids}
                    f.write(json.dumps(row) + "\n")
                    done.append(row)
            engine.requests.clear()
            bar.update(len(ids))
    return done


@torch.no_grad()
def target_features(model, samples: list[dict], path: Path) -> list[torch.Tensor]:
    """Final hidden states of the target over each prompt + answer (float16 to halve the disk)."""
    if path.exists():
        return torch.load(path)
    feats = []
    for s in tqdm(samples, desc="2/3 target features", unit="sample"):
        ids = s["prompt_ids"] + s["answer_ids"]
        meta = AttentionMetadata.for_full_sequences([len(ids)], model.device)
        feats.append(model(torch.tensor(ids, device=model.device), FullCausalAttention(), meta).half().cpu())
    torch.save(feats, path)
    return feats


def pairs(sample: dict, feats: torch.Tensor):
    """Training rows of one sample: input (f_t, token t+1) at position t, target f_{t+1};
    only rows whose predicted token (t+2) lies in the answer count."""
    ids = sample["prompt_ids"] + sample["answer_ids"]
    n = len(ids) - 1  # rows t = 0 .. n-1 need f_{t+1}
    mask = torch.arange(n) + 2 > len(sample["prompt_ids"])
    return feats[:n].float(), torch.tensor(ids[1:n + 1]), feats[1:n + 1].float(), mask


def batches(indices: list[int], samples, feats, batch_tokens: int):
    """Groups of whole samples, about batch_tokens rows each, packed as one ragged batch."""
    group, size = [], 0
    for i in indices:
        group.append(i)
        size += len(samples[i]["prompt_ids"]) + len(samples[i]["answer_ids"])
        if size >= batch_tokens:
            yield group
            group, size = [], 0
    if group:
        yield group


def run_batch(head: EagleHead, target, group, samples, feats, device):
    """Forward one packed batch; returns (loss, correct top-1, counted rows)."""
    rows = [pairs(samples[i], feats[i]) for i in group]
    f_in, tokens, f_next, mask = (torch.cat([r[j] for r in rows]).to(device) for j in range(4))
    meta = AttentionMetadata.for_full_sequences([len(r[1]) for r in rows], device)
    with torch.no_grad():
        embeds = target.model.embed_tokens(tokens)
    predicted = head(f_in, embeds, FullCausalAttention(), meta)[mask]
    true = f_next[mask]
    reg = F.smooth_l1_loss(predicted, true)
    logits = target.compute_logits(predicted)
    with torch.no_grad():
        true_logits = target.compute_logits(true)
    cls = -(true_logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
    correct = (logits.argmax(-1) == true_logits.argmax(-1)).sum().item()
    return reg + CLS_WEIGHT * cls, correct, int(mask.sum())


def evaluate(head, target, eval_idx, samples, feats, device, batch_tokens) -> float:
    head.eval()
    correct = total = 0
    with torch.no_grad():
        for group in batches(eval_idx, samples, feats, batch_tokens):
            _, c, n = run_batch(head, target, group, samples, feats, device)
            correct, total = correct + c, total + n
    head.train()
    return correct / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.s05_speculative.train_eagle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--prompts", type=int, default=384, help="training prompts")
    p.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--answer-tokens", type=int, default=80)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--work", type=Path, default=Path("eagle_work"), help="resumable intermediate files")
    p.add_argument("--out", type=Path, default=DEFAULT_HEAD)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    loaded = load_model(args.model, device=args.device)
    target = loaded.model.requires_grad_(False)

    requests = sample_requests(loaded.tokenizer, args.prompts + args.eval_prompts, seed=args.seed,
                               max_prompt_tokens=args.max_prompt_tokens)
    samples = generate_answers(loaded, [r.prompt for r in requests], args.answer_tokens,
                               args.work / "answers.jsonl")
    feats = target_features(target, samples, args.work / "features.pt")
    train_idx, eval_idx = list(range(args.prompts)), list(range(args.prompts, len(samples)))

    head = EagleHead(target.config).to(args.device).train()
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(list(batches(train_idx, samples, feats, args.batch_tokens)))
    total_steps = steps_per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) *
                                              0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    start_epoch, ckpt = 0, args.work / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start_epoch = state["epoch"] + 1
        print(f"resumed after epoch {state['epoch'] + 1}", file=sys.stderr)
    rng = random.Random(args.seed)
    for epoch in range(start_epoch, args.epochs):
        order = train_idx[:]
        random.Random(rng.random() + epoch).shuffle(order)
        bar = tqdm(list(batches(order, samples, feats, args.batch_tokens)), desc=f"3/3 epoch {epoch + 1}/{args.epochs}")
        for group in bar:
            loss, correct, n = run_batch(head, target, group, samples, feats, args.device)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{correct / max(n, 1):.2f}")
        acc = evaluate(head, target, eval_idx, samples, feats, args.device, args.batch_tokens)
        print(f"epoch {epoch + 1}: held-out top-1 {acc:.3f}", file=sys.stderr)
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "epoch": epoch}, ckpt)
    acc = evaluate(head, target, eval_idx, samples, feats, args.device, args.batch_tokens)
    command = "python -m course.s05_speculative.train_eagle " + " ".join(argv if argv is not None else sys.argv[1:])
    head.save(args.out, {"heldout_top1": f"{acc:.4f}", "train_prompts": args.prompts, "epochs": args.epochs,
                         "answer_tokens": args.answer_tokens, "command": command.strip()})
    params = sum(x.numel() for x in head.parameters())
    print(f"wrote {args.out} ({params / 1e6:.2f}M parameters, {args.out.stat().st_size / 2**20:.1f} MiB); "
          f"held-out top-1 {acc:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
