"""Self-distillation at batch speed: stage 04's engine with its decode steps attended in one batch.

Stage 03's paged attention is a lesson: each sequence gathers its blocks and attends in a Python
loop, 64 small products per layer at batch 64, and at that batch the loop is most of a step.
Making a million answer tokens is all decode steps, so here a step whose rows are all decodes
gathers every sequence's blocks at once (padded to the longest) and attends in one masked
product; any step with a prefill chunk goes through the lesson's loop. The answers are the
same (tested against the lesson's attention).

    python -m course.s05_speculative.training.batched_decode [--prompts 64] [--tokens 128]

times both engines on the same ShareGPT prompts, side by side, and checks they answer alike.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata
from course.s04_continuous_batching.engine import LLMEngine


class BatchedDecodeAttention(PagedAttention):
    def forward(self, layer, q, k, v, meta: PagedAttentionMetadata):
        if q.shape[0] != meta.seq_lens.shape[0]:  # some sequence brings more than one row
            return super().forward(layer, q, k, v, meta)
        bs = self.cache.block_size
        k_pool, v_pool = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, bs, kv, d]
        k_pool.view(-1, *k.shape[1:])[meta.slot_mapping] = k
        v_pool.view(-1, *v.shape[1:])[meta.slot_mapping] = v
        lens = meta.seq_lens
        width = -(-int(lens.max()) // bs)
        blocks = meta.block_tables[:, :width]  # unused entries point at some block: masked below
        keys = k_pool[blocks].flatten(1, 2).transpose(1, 2)  # [B, kv, L, d]
        values = v_pool[blocks].flatten(1, 2).transpose(1, 2)
        seen = torch.arange(width * bs, device=q.device)[None, :] < lens[:, None]  # [B, L]
        out = F.scaled_dot_product_attention(q[:, :, None].float(), keys.float(), values.float(),
                                             attn_mask=seen[:, None, None, :], enable_gqa=True)
        return out[:, :, 0].to(q.dtype)

class DistillEngine(LLMEngine):
    """Stage 04's engine with BatchedDecodeAttention: the same answers, made faster."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.attn = BatchedDecodeAttention(self.cache)


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
