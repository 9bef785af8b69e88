"""The EAGLE head's data: ShareGPT answers and the target's features over them.

Training (as EAGLE-1): fixed ShareGPT first exchanges, the chat-formatted prompt followed by the
recorded answer. The target reads each one in a single prefill pass, and its final hidden
states are the features the head learns to predict. Prefill is ~20x faster per token than
generating, so this gets tens of times more tokens than asking the target to answer. Beside
them, a smaller set of prompts answered by the target itself (self-distillation): the text the
head will draft for at serving time, which a small target writes quite unlike ChatGPT.

Evaluation: held-out prompts answered greedily by the target itself, because acceptance is
measured against what the target generates. These prompts are the chat workload of stage 05's
benchmark, and no training conversation shares one.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tqdm import tqdm

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.bench.workloads import _first_exchange, load_conversations, sample_requests
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

HELDOUT_START = 384  # the held-out prompts are sample_requests(..., seed=0)[384:], as for the first head


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
        return [json.loads(line) for line in path.read_text().splitlines()]
    rows = make()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def target_answers(loaded, prompt_ids: list[list[int]], answer_tokens: int, batch: int = 32) -> list[dict]:
    """The target's greedy answers {prompt_ids, answer_ids} to chat-formatted prompts, through
    stage 04's engine (self-distillation: the head learns on what it will draft for)."""
    engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(num_blocks=4096, max_num_seqs=batch,
                                                                     max_num_batched_tokens=1024, record_steps=False),
                       loaded.eos_token_ids)
    ids = [list(p) for p in prompt_ids]
    outs = engine.generate(ids, SamplingParams(max_new_tokens=answer_tokens, temperature=0))
    return [{"prompt_ids": p, "answer_ids": o.token_ids} for p, o in zip(ids, outs)]


@torch.no_grad()
def target_features(model, samples: list[dict], path: Path, batch_tokens: int = 2048, desc: str = "features"):
    """Final hidden states of the target over each prompt + answer (float16 to halve the disk), and
    how often each token is the target's greedy choice at an answer position (for the draft
    vocabulary). Packed batches of about batch_tokens rows; saved to `path` once."""
    if path.exists():
        saved = torch.load(path)
        return saved["features"], saved["counts"]
    feats, counts = [], torch.zeros(model.config.vocab_size, dtype=torch.int64)
    groups = list(packed_groups(range(len(samples)), samples, batch_tokens))
    for group in tqdm(groups, desc=desc, unit="batch"):
        seqs = [samples[i]["prompt_ids"] + samples[i]["answer_ids"] for i in group]
        meta = AttentionMetadata.for_full_sequences([len(s) for s in seqs], model.device)
        hidden = model(torch.tensor(sum(seqs, []), device=model.device), FullCausalAttention(), meta)
        for i, part in zip(group, hidden.split([len(s) for s in seqs])):
            feats.append(part.half().cpu())
            answer_from = len(samples[i]["prompt_ids"]) - 1  # the row that predicts the answer's first token
            chosen = model.compute_logits(part[answer_from:]).argmax(-1).cpu()
            counts += torch.bincount(chosen, minlength=counts.numel())
    torch.save({"features": feats, "counts": counts}, path)
    return feats, counts


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
