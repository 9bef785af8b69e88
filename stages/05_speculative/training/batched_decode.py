"""Self-distillation at batch speed: stage 04's engine with its decode steps attended in one batch.

Stage 03's paged attention is a lesson: each sequence gathers its blocks and attends in a Python
loop, 64 small products per layer at batch 64, and at that batch the loop is most of a step.
Making a million answer tokens is all decode steps. Gathering every sequence's blocks at once
(padded to the longest) still copies the whole batch's K/V once per layer per step. So here
each running sequence also keeps its K/V in a dense copy, one row per request ([slot, kv heads,
position, d] per layer), written as the pool is: a step whose rows are all decodes attends over
the dense copy in one masked product, nothing gathered. Any step with a prefill chunk goes
through the lesson's loop (the pool is always written). The answers are the same (tested
against the lesson's attention).

    python -m course.s05_speculative.training.batched_decode [--prompts 64] [--tokens 128]

times both engines on the same ShareGPT prompts, side by side, and checks they answer alike.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata
from course.s04_continuous_batching.engine import LLMEngine


class BatchedDecodeAttention(PagedAttention):
    """The lesson's paged attention, plus a dense copy of each running request's K/V. The engine
    names the step's requests (`requests`, in row order) before each forward."""

    def __init__(self, cache, max_seqs: int):
        super().__init__(cache)
        self.max_seqs = max_seqs
        self.dense_k = self.dense_v = None  # [layers, slots, kv, length, d], grown as sequences do
        self.slot_of: dict[int, int] = {}   # request id -> its row of the dense copy
        self.held = [0] * max_seqs          # positions 0 .. held-1 of each row are current
        self.requests: list[int] = []

    def forward(self, layer, q, k, v, meta: PagedAttentionMetadata):
        if layer == 0:
            self._place(meta)
        slots = self._row_slots
        self.dense_k[layer][slots, :, meta.positions] = k
        self.dense_v[layer][slots, :, meta.positions] = v
        if q.shape[0] != meta.seq_lens.shape[0]:  # some sequence brings more than one row
            return super().forward(layer, q, k, v, meta)
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # the pool stays the truth for the loop
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        width = int(meta.seq_lens.max())
        lens = torch.ones(self.max_seqs, dtype=torch.long, device=q.device)  # idle rows see one key: no NaN
        lens[slots] = meta.seq_lens
        queries = q.new_zeros(self.max_seqs, *q.shape[1:])
        queries[slots] = q
        seen = torch.arange(width, device=q.device)[None, :] < lens[:, None]
        out = F.scaled_dot_product_attention(queries[:, :, None], self.dense_k[layer, :, :, :width],
                                             self.dense_v[layer, :, :, :width], attn_mask=seen[:, None, None, :],
                                             enable_gqa=True)
        return out[slots, :, 0]

    def _place(self, meta: PagedAttentionMetadata) -> None:
        """Give each of the step's requests its dense row (a new one: any free row), copy from the
        pool what the row lacks before this step's tokens, and map every token row to its slot."""
        lens, bounds = meta.seq_lens.tolist(), meta.cu_seqlens_q.tolist()
        step = set(self.requests)
        for rid in [r for r in self.slot_of if r not in step]:  # finished or preempted: a later return refills
            del self.slot_of[rid]
        free = sorted(set(range(self.max_seqs)) - set(self.slot_of.values()))
        self._grow(max(lens))
        row_slots = []
        for b, rid in enumerate(self.requests):
            if rid not in self.slot_of:
                self.slot_of[rid] = slot = free.pop(0)
                self.held[slot] = 0
            slot = self.slot_of[rid]
            start = lens[b] - (bounds[b + 1] - bounds[b])  # positions before this step's rows
            if self.held[slot] < start:
                self._fill(slot, meta.block_tables[b], self.held[slot], start)
            self.held[slot] = lens[b]
            row_slots += [slot] * (bounds[b + 1] - bounds[b])
        self._row_slots = torch.tensor(row_slots, device=meta.seq_lens.device)

    def _grow(self, length: int) -> None:
        have = 0 if self.dense_k is None else self.dense_k.shape[3]
        if length <= have:
            return
        layers, _, _, kv, d = self.cache.k.shape
        grown = [self.cache.k.new_zeros(layers, self.max_seqs, kv, max(length, 2 * have), d) for _ in range(2)]
        if have:
            grown[0][:, :, :, :have], grown[1][:, :, :, :have] = self.dense_k, self.dense_v
        self.dense_k, self.dense_v = grown

    def _fill(self, slot: int, block_table: torch.Tensor, start: int, end: int) -> None:
        """Positions start .. end-1 of one request, every layer, from the pool (a prefix-cache hit,
        or tokens written while the request had no row)."""
        blocks = block_table[: -(-end // self.cache.block_size)]
        for dense, pool in ((self.dense_k, self.cache.k), (self.dense_v, self.cache.v)):
            dense[:, slot, :, start:end] = pool[:, blocks].flatten(1, 2)[:, start:end].transpose(1, 2)


class DistillEngine(LLMEngine):
    """Stage 04's engine with BatchedDecodeAttention: the same answers, made faster."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.attn = BatchedDecodeAttention(self.cache, self.config.max_num_seqs)

    def _run(self, chunks):
        self.attn.requests = [req.request_id for req, _ in chunks]
        return super()._run(chunks)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import time

    from course.s01_decode_loop.bench.measure import machine_line
    from course.s01_decode_loop.bench.workloads import sample_requests
    from course.s01_decode_loop.generate import encode_prompt
    from course.s01_decode_loop.sampling import SamplingParams
    from course.s01_decode_loop.weights import load_model
    from course.s04_continuous_batching.engine import EngineConfig

    p = argparse.ArgumentParser(prog="python -m course.s05_speculative.training.batched_decode")
    p.add_argument("--prompts", type=int, default=64, help="answered at once (the batch)")
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args(argv)
    loaded = load_model()
    prompts = [encode_prompt(loaded.tokenizer, r.prompt, chat=True)
               for r in sample_requests(loaded.tokenizer, args.prompts, seed=5, max_prompt_tokens=192)]
    config = EngineConfig(num_blocks=4096, max_num_seqs=args.prompts, max_num_batched_tokens=1024, record_steps=False)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0)
    results = {}
    for name, engine_cls in [("stage 04's engine", LLMEngine), ("batched decode attention", DistillEngine)]:
        engine = engine_cls(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids)
        start = time.perf_counter()
        outputs = [o.token_ids for o in engine.generate(prompts, params)]
        seconds = time.perf_counter() - start
        results[name] = (outputs, sum(map(len, outputs)) / seconds)
        print(f"{name:26s} {results[name][1]:7.1f} tok/s", flush=True)
    (a, ra), (b, rb) = results.values()
    print(f"{rb / ra:.2f}x; answers equal: {a == b}; {machine_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
