"""Train an EAGLE head: the target's features over ShareGPT answers and its own answers, a reduced
draft vocabulary, and training-time test (the head trained on its own chained predictions).

    python -m course.s05_speculative.training.train_eagle --self-distill 6000 --data-only   # the data: hours, resumable
    python -m course.s05_speculative.training.train_eagle --self-distill 6000               # then the head

`--head eagle3` (the default) trains eagle3.py's head on three tapped layers; `--head eagle` the
EAGLE-1/2 head of eagle.py on the final hidden state. Steps, each saved in --work so an
interrupted run resumes where it stopped:
  1. train.jsonl, eval.jsonl   ShareGPT first exchanges (chat template + the recorded answer) to
                               train on; held-out prompts answered greedily by the target to test on
     distill.jsonl             with --self-distill N: N more prompts answered by the target, made
                               a chunk at a time through stage 04's engine (batched_decode.py)
  2. *_features[_tapsL-M-H]/   the target's final hidden states over each (one prefill pass), the
                               tapped layers' outputs for an EAGLE-3 head, and how often each token
                               is its greedy choice (the draft vocabulary); a shard at a time
  3. ckpt_HEAD.pt              head + optimizer after every epoch
and at the end the head (bfloat16 safetensors) at --out. Its metadata records the held-out top-1
(how often the head's first draft equals the target's greedy token) and the mean accepted
length of a greedy chain of k drafts (tokens a target forward emits, 1 + leading hits), both
measured on the target's own answers to the held-out prompts; `--evaluate HEAD` prints the same
two figures for any head, on the same data. `--model` takes any model folder the engine loads.
"""
from __future__ import annotations

import argparse
import functools
import math
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from course.s01_decode_loop.attention import AttentionMetadata
from course.s01_decode_loop.bench.workloads import load_conversations
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.weights import load_model

from ..eagle import EAGLE1_HEAD, EagleHead
from ..eagle3 import DEFAULT_HEAD3, Eagle3Head, default_taps
from .eagle_data import (benchmark_prompts, cached_jsonl, distill_answers, draft_vocabulary, heldout_prompts,
                         packed_groups, sharegpt_samples, target_answers, target_features)
from .eagle_training import accepted_lengths, chain_hits, rows_with_base, step_losses, unrolled_predictions


def packed_batch(group, samples, feats, tapped, device):
    """One ragged batch: row t of a sample is (f_t, token t+1) -> f_{t+1}, where the head reads
    the tapped layers at t instead of f_t when there are any (EAGLE-3); `counted` marks rows
    whose predicted token (t+2) lies in the answer."""
    rows = []
    for i in group:
        ids = samples[i]["prompt_ids"] + samples[i]["answer_ids"]
        n = len(ids) - 1
        counted = torch.arange(n) + 2 > len(samples[i]["prompt_ids"])
        read = feats[i] if tapped is None else tapped[i]
        rows.append((read[:n].float(), torch.tensor(ids[1:n + 1]), feats[i][1:n + 1].float(), counted))
    f_in, tokens, f_next, counted = (torch.cat([r[j] for r in rows]).to(device) for j in range(4))
    return f_in, tokens, f_next, counted, AttentionMetadata.for_full_sequences([len(r[1]) for r in rows], device)


@torch.no_grad()
def evaluate(head, target, samples, feats, tapped, device, k: int, batch_tokens: int) -> dict:
    """Held-out top-1 of each chained step and the mean accepted length of k greedy drafts."""
    head.eval()
    hits_by_step, lengths = [[] for _ in range(k)], []
    for group in packed_groups(range(len(samples)), samples, batch_tokens):
        f_in, tokens, f_next, counted, meta = packed_batch(group, samples, feats, tapped, device)
        preds = unrolled_predictions(head, target.model.embed_tokens(tokens), f_in, meta, k)
        hits = chain_hits(head, target, preds, f_next).cpu()
        for j in range(k):
            hits_by_step[j].append(hits[j][(counted & rows_with_base(meta, j)).cpu()])
        bases = counted.cpu() & torch.roll(rows_with_base(meta, k - 1).cpu(), -(k - 1))  # b+k-1 in the sequence
        bases[len(bases) - (k - 1):] = False
        lengths.append(accepted_lengths(hits, bases.nonzero().flatten(), k))
    head.train()
    top1 = [torch.cat(h).float().mean().item() for h in hits_by_step]
    return {"top1": top1[0], "top1_by_step": top1, f"accepted_length_k{k}": torch.cat(lengths).mean().item()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.s05_speculative.training.train_eagle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--head", choices=["eagle", "eagle3"], default="eagle3",
                   help="eagle: EAGLE-1/2's head on the final hidden state; eagle3: three layers fused (eagle3.py)")
    p.add_argument("--taps", help="comma-separated target layers an eagle3 head reads (default: 2, L/2, L-3)")
    p.add_argument("--prompts", type=int, default=1200, help="ShareGPT conversations to train on")
    p.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts (the benchmark's chat workload)")
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--answer-tokens", type=int, default=256, help="ShareGPT answers are cut to this many tokens")
    p.add_argument("--eval-answer-tokens", type=int, default=80, help="tokens the target answers each held-out prompt")
    p.add_argument("--self-distill", type=int, default=0,
                   help="more prompts, answered by the target itself (made a chunk at a time, resumable)")
    p.add_argument("--distill-prompt-tokens", type=int, default=384, help="longest prompt to self-distill")
    p.add_argument("--distill-answer-tokens", type=int, default=256, help="tokens the target answers each of them")
    p.add_argument("--data-only", action="store_true", help="make the training data, then stop")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head may draft (0: the whole vocabulary)")
    p.add_argument("--ttt-steps", type=int, default=3, help="chained steps trained (1: EAGLE-1's single step)")
    p.add_argument("--eval-k", type=int, default=4, help="drafts per chain for the accepted-length figure")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true",
                   help="train under bfloat16 autocast (weights and optimizer stay float32): ~1.5x faster "
                        "where the CPU multiplies bfloat16 natively (AMX, AVX-512 BF16) and on a GPU")
    p.add_argument("--work", type=Path, default=Path("eagle_work"), help="resumable intermediate files")
    p.add_argument("--out", type=Path, help="the head file (default: the stage's shipped head of that kind)")
    p.add_argument("--evaluate", type=Path, metavar="HEAD", help="only print HEAD's held-out figures")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    loaded = load_model(args.model, device=args.device)
    target, tok = loaded.model.requires_grad_(False), loaded.tokenizer

    def features_dir(name: str, taps: tuple[int, ...]) -> Path:  # one folder per set of tapped layers
        return args.work / (f"{name}_features" + (f"_taps{'-'.join(map(str, taps))}" if taps else ""))

    # the held-out prompts, chosen only when a step still to make needs them (a resumed run does not)
    prompts = functools.cache(lambda: heldout_prompts(tok, args.eval_prompts, args.max_prompt_tokens))
    eval_samples = cached_jsonl(args.work / "eval.jsonl",
                                lambda: target_answers(loaded, [encode_prompt(tok, x, chat=True) for x in prompts()],
                                                       args.eval_answer_tokens))
    if args.evaluate:
        head = EagleHead.load(args.evaluate, target)
        eval_feats, eval_taps, _ = target_features(target, eval_samples, features_dir("eval", head.tap_layers),
                                                   head.tap_layers, desc="held-out features")
        result = evaluate(head, target, eval_samples, eval_feats, eval_taps, args.device, args.eval_k,
                          args.batch_tokens)
        print(f"{args.evaluate}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else
                                             f"{k} {[round(x, 3) for x in v]}" for k, v in result.items()))
        return 0
    never = functools.cache(lambda: set(prompts()) | benchmark_prompts(load_conversations()))
    samples = cached_jsonl(args.work / "train.jsonl", lambda: sharegpt_samples(
        tok, args.prompts, never(), args.max_prompt_tokens, args.answer_tokens, seed=args.seed + 1))
    if args.self_distill:  # more conversations (another draw), answered by the target itself
        asked = sharegpt_samples(tok, args.self_distill, never(), args.distill_prompt_tokens, 1, seed=args.seed + 2)
        distilled = distill_answers(loaded, [s["prompt_ids"] for s in asked], args.work / "distill.jsonl",
                                    args.distill_answer_tokens)
    if args.data_only:
        return 0
    taps = (tuple(int(x) for x in args.taps.split(",")) if args.taps else default_taps(target.config.num_hidden_layers)
            ) if args.head == "eagle3" else ()
    eval_feats, eval_taps, _ = target_features(target, eval_samples, features_dir("eval", taps), taps,
                                               desc="held-out features")
    feats, tapped, counts = target_features(target, samples, features_dir("train", taps), taps,
                                            desc="training features")
    if args.self_distill:
        more, more_taps, more_counts = target_features(target, distilled, features_dir("distill", taps), taps,
                                                       desc="self-distilled features")
        samples, feats, counts = samples + distilled, feats + more, counts + more_counts
        tapped = tapped + more_taps if taps else None
    vocab = draft_vocabulary(counts, args.draft_vocab)
    if vocab is not None:
        answered = torch.tensor([t for s in eval_samples for t in s["answer_ids"]])
        print(f"draft vocabulary: {len(vocab)} tokens, {counts[vocab].sum() / counts.sum():.3f} of the training "
              f"answers' greedy tokens, {torch.isin(answered, vocab).float().mean():.3f} of the held-out answers'",
              file=sys.stderr)

    head = (Eagle3Head(target.config, vocab, taps) if taps else EagleHead(target.config, vocab)).to(args.device).train()
    out = args.out or (DEFAULT_HEAD3 if taps else EAGLE1_HEAD)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(list(packed_groups(range(len(samples)), samples, args.batch_tokens)))
    total_steps = steps_per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) *
                                              0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    start_epoch, ckpt = 0, args.work / f"ckpt_{args.head}.pt"
    if ckpt.exists():
        state = torch.load(ckpt)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start_epoch = state["epoch"] + 1
        print(f"resumed after epoch {state['epoch'] + 1}", file=sys.stderr)
    rng = random.Random(args.seed)
    for epoch in range(start_epoch, args.epochs):
        order = list(range(len(samples)))
        random.Random(rng.random() + epoch).shuffle(order)
        bar = tqdm(list(packed_groups(order, samples, args.batch_tokens)), desc=f"epoch {epoch + 1}/{args.epochs}")
        for group in bar:
            f_in, tokens, f_next, counted, meta = packed_batch(group, samples, feats, tapped, args.device)
            with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.bf16):
                preds = unrolled_predictions(head, target.model.embed_tokens(tokens), f_in, meta, args.ttt_steps)
                loss = step_losses(head, target, preds, f_next, counted, meta)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        result = evaluate(head, target, eval_samples, eval_feats, eval_taps, args.device, args.eval_k, args.batch_tokens)
        print(f"epoch {epoch + 1}: held-out {result}", file=sys.stderr)
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "epoch": epoch}, ckpt)
    head.save(out)  # measured as shipped: weights rounded to bfloat16
    head = EagleHead.load(out, target)
    result = evaluate(head, target, eval_samples, eval_feats, eval_taps, args.device, args.eval_k, args.batch_tokens)
    command = "python -m course.s05_speculative.training.train_eagle " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"heldout_top1": f"{result['top1']:.4f}",
            f"heldout_accepted_length_k{args.eval_k}": f"{result[f'accepted_length_k{args.eval_k}']:.4f}",
            "train_conversations": args.prompts, "answer_tokens": args.answer_tokens, "epochs": args.epochs,
            "head": args.head, "taps": ",".join(map(str, taps)), "self_distill": args.self_distill,
            "distill_answer_tokens": args.distill_answer_tokens, "ttt_steps": args.ttt_steps, "draft_vocab": len(vocab) if vocab is not None else 0,
            "command": command.strip()}
    head.save(out, meta)
    params = sum(x.numel() for x in head.parameters())
    print(f"wrote {out} ({params / 1e6:.2f}M parameters, {out.stat().st_size / 2**20:.1f} MiB); "
          f"held-out top-1 {result['top1']:.3f}, accepted length (k={args.eval_k}) "
          f"{result[f'accepted_length_k{args.eval_k}']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
