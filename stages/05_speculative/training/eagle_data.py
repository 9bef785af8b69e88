"""The EAGLE head's data: ShareGPT answers and the target's features over them.

Training (as EAGLE-1): fixed ShareGPT first exchanges, the chat-formatted prompt followed by the
recorded answer. The target reads each one in a single prefill pass, and its final hidden
states are the features the head learns to predict. Prefill is ~20x faster per token than
generating, so this gets tens of times more tokens than asking the target to answer. Beside
them, a smaller set of prompts answered by the target itself (self-distillation): the text the
head will draft for at serving time, which a small target writes quite unlike ChatGPT.

The self-distilled answers are the data that pays most per token, and the most expensive to make
(~100 tokens/s batched through stage 04's engine on 2 CPU cores, so a million tokens take hours):
`distill_answers` appends them to a JSONL file a chunk at a time, and a run stopped anywhere
resumes after the last complete chunk.

Evaluation: held-out prompts answered greedily by the target itself, because acceptance is
measured against what the target generates. These prompts are the chat workload of stage 05's
benchmark; no training conversation shares one, nor one of the first draws of any benchmark that
measures speculation (`benchmark_prompts`).
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.bench.workloads import _first_exchange, load_conversations, sample_requests
from course.s04_continuous_batching.engine import EngineConfig

from .batched_decode import DistillEngine

HELDOUT_START = 384  # the held-out prompts are sample_requests(..., seed=0)[384:], as for the first head
BENCHMARK_DRAWS = 2048  # conversations at the head of each benchmark's shuffled order, never trained on


def benchmark_prompts(conversations: list[list[dict]]) -> set[str]:
    """Prompt texts the head must never train on: the first BENCHMARK_DRAWS conversations of every
    order the benchmarks draw from (sample_requests with seed 0, which holds the held-out prompts
    and final/'s engine and serving benchmarks, and seed 7, final/'s precision check; and vLLM's
    benchmark client, which shuffles the conversations of two or more turns with seed 0)."""
    texts = set()
    for seed in (0, 7):
        order = list(range(len(conversations)))
        random.Random(seed).shuffle(order)
        texts |= {pair[0] for i in order[:BENCHMARK_DRAWS] if (pair := _first_exchange(conversations[i]))}
    vllm_order = [c for c in conversations if len(c) >= 2]
    random.Random(0).shuffle(vllm_order)
    texts |= {c[0]["value"] for c in vllm_order[:BENCHMARK_DRAWS]}
    return texts


def heldout_prompts(tokenizer, n: int, max_prompt_tokens: int = 192) -> list[str]:
    return [r.prompt for r in sample_requests(tokenizer, HELDOUT_START + n, seed=0,
                                              max_prompt_tokens=max_prompt_tokens)[HELDOUT_START:]]


def sharegpt_samples(tokenizer, n: int, exclude: set[str], max_prompt_tokens: int, answer_tokens: int,
                     seed: int = 1) -> list[dict]:
    """n training samples {prompt_ids, answer_ids}: ShareGPT first exchanges whose prompt is not
    in `exclude`, the answer cut to `answer_tokens` (the end-of-turn token appended if it fits)."""
    conversations = load_conversations()
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    end_of_turn = tokenizer.eos_token_id
    samples = []
    for i in order:
        if len(samples) == n:
            break
        pair = _first_exchange(conversations[i])
        if pair is None or pair[0] in exclude:
            continue
        prompt_ids = encode_prompt(tokenizer, pair[0], chat=True)
        answer = tokenizer.encode(pair[1], add_special_tokens=False)
        if not 4 <= len(prompt_ids) <= max_prompt_tokens or len(answer) < 4:
            continue
        if end_of_turn is not None:
            answer = answer + [end_of_turn]
        samples.append({"prompt_ids": prompt_ids, "answer_ids": answer[:answer_tokens]})
    if len(samples) < n:
        raise ValueError(f"only {len(samples)} ShareGPT conversations fit (prompt <= {max_prompt_tokens} tokens)")
    return samples


def cached_jsonl(path: Path, make) -> list[dict]:
    """Rows of `path`, made by `make()` and written once (so a resumed run reuses them)."""
    if path.exists():
        return read_jsonl(path)
    rows = make()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """Complete rows of a JSONL file; a line cut short by an interrupted write is dropped (and
    cut off the file, so appending goes on from a clean line)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
    return [json.loads(line) for line in whole.decode().splitlines()]


def distill_answers(loaded, prompt_ids: list[list[int]], path: Path, answer_tokens: int, chunk: int = 256,
                    batch: int = 96) -> list[dict]:
    """The target's greedy answers to every prompt, appended to `path` a chunk at a time: a run
    stopped anywhere resumes after its last complete chunk. Rows already there must answer the
    same prompts, in order (a resumed run asks the same questions)."""
    done = read_jsonl(path)
    for i, row in enumerate(done[:len(prompt_ids)]):
        if row["prompt_ids"] != list(prompt_ids[i]):
            raise ValueError(f"{path} row {i} answers another prompt than this run asks: delete it or use "
                             "the options it was made with")
    with open(path, "a") as f:
        for start in range(len(done), len(prompt_ids), chunk):
            rows = target_answers(loaded, prompt_ids[start:start + chunk], answer_tokens, batch)
            f.write("".join(json.dumps(r) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
            done += rows
            made = sum(len(r["answer_ids"]) for r in done)
            print(f"self-distilled {len(done)}/{len(prompt_ids)} answers, {made:,} tokens", file=sys.stderr, flush=True)
    return done[:len(prompt_ids)]


def target_answers(loaded, prompt_ids: list[list[int]], answer_tokens: int, batch: int = 32) -> list[dict]:
    """The target's greedy answers {prompt_ids, answer_ids} to chat-formatted prompts, through
    stage 04's engine (self-distillation: the head learns on what it will draft for)."""
    engine = DistillEngine(loaded.model, loaded.tokenizer, EngineConfig(num_blocks=4096, max_num_seqs=batch,
                                                                        max_num_batched_tokens=1024, record_steps=False),
                           loaded.eos_token_ids)
    ids = [list(p) for p in prompt_ids]
    outs = engine.generate(ids, SamplingParams(max_new_tokens=answer_tokens, temperature=0))
    return [{"prompt_ids": p, "answer_ids": o.token_ids} for p, o in zip(ids, outs)]


@torch.no_grad()
def target_features(model, samples: list[dict], folder: Path, taps: tuple[int, ...] = (), batch_tokens: int = 2048,
                    desc: str = "features", shard: int = 512):
    """The target's final hidden states over each prompt + answer (float16 to halve the disk), the
    outputs of its `taps` layers side by side (an EAGLE-3 head reads them; bfloat16, whose range
    holds any layer's output), and how often each token is the target's greedy choice at an
    answer position (for the draft vocabulary). Packed batches of about batch_tokens rows; saved
    in `folder` `shard` samples at a time, so a stopped run resumes and a grown sample list only
    adds shards. Returns (features, tapped or None, counts)."""
    folder.mkdir(parents=True, exist_ok=True)
    feats, tapped, counts = [], [], torch.zeros(model.config.vocab_size, dtype=torch.int64)
    model.model.tap_layers = tuple(taps)
    try:
        for first in tqdm(range(0, len(samples), shard), desc=desc, unit="shard"):
            part_samples = samples[first:first + shard]
            path = folder / f"{first // shard:05d}.pt"
            part = torch.load(path) if path.exists() else None
            if part is None or len(part["features"]) != len(part_samples):
                part = _features_of(model, part_samples, batch_tokens)
                torch.save(part, path.with_suffix(".part"))
                path.with_suffix(".part").rename(path)  # never a half-written shard
            feats += part["features"]
            tapped += part["taps"]
            counts += part["counts"]
    finally:
        model.model.tap_layers = ()
    return feats, (tapped if taps else None), counts


def _features_of(model, samples: list[dict], batch_tokens: int) -> dict:
    feats, tapped, counts = [], [], torch.zeros(model.config.vocab_size, dtype=torch.int64)
    for group in packed_groups(range(len(samples)), samples, batch_tokens):
        seqs = [samples[i]["prompt_ids"] + samples[i]["answer_ids"] for i in group]
        sizes = [len(s) for s in seqs]
        meta = AttentionMetadata.for_full_sequences(sizes, model.device)
        hidden = model(torch.tensor(sum(seqs, []), device=model.device), FullCausalAttention(), meta)
        if model.model.tapped is not None:
            tapped += [t.bfloat16().cpu() for t in model.model.tapped.split(sizes)]
        for i, part in zip(group, hidden.split(sizes)):
            feats.append(part.half().cpu())
            answer_from = len(samples[i]["prompt_ids"]) - 1  # the row that predicts the answer's first token
            chosen = model.compute_logits(part[answer_from:]).argmax(-1).cpu()
            counts += torch.bincount(chosen, minlength=counts.numel())
    return {"features": feats, "taps": tapped, "counts": counts}


def draft_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor | None:
    """The `size` tokens the target chose most often (None: the whole vocabulary)."""
    if size <= 0 or size >= counts.numel():
        return None
    return torch.topk(counts, size).indices.sort().values


def packed_groups(indices, samples: list[dict], batch_tokens: int):
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
