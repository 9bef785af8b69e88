"""`python -m course.s04_continuous_batching`: stage 01's CLI contract, but every prompt is
submitted at once and they all run concurrently through the engine."""
from __future__ import annotations

import json
import sys

from course.s01_decode_loop.cli import build_parser, prepare
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.weights import ModelLoadError

from .engine import EngineConfig, LLMEngine


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, "Stage 04: continuous batching; all prompts run concurrently.", lambda group: None,
                   lambda loaded, args, config: LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(**config),
                                                          loaded.eos_token_ids))


def run_cli(argv, description: str, add_args, make_engine) -> int:
    """The stage 04 command line; a later stage adds its flags (`add_args(group)`) and builds its
    own engine (`make_engine(loaded, args, config_kwargs)`)."""
    parser = build_parser(description)
    g = parser.add_argument_group("engine")
    g.add_argument("--kv-blocks", type=int, default=256)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--max-num-seqs", type=int, default=32)
    g.add_argument("--max-num-batched-tokens", type=int, default=256)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--no-prefix-caching", action="store_true")
    add_args(g)
    args = parser.parse_args(argv)
    try:
        prompts, params, loaded = prepare(parser, args)
        config = dict(num_blocks=args.kv_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens,
                      enable_chunked_prefill=not args.no_chunked_prefill,
                      enable_prefix_caching=not args.no_prefix_caching, max_waiting=max(1024, len(prompts)))
        engine = make_engine(loaded, args, config)
        ids = [engine.add_request(encode_prompt(loaded.tokenizer, p, args.chat, args.system), params)
               for p in prompts]
    except (ValueError, ModelLoadError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    while engine.has_unfinished():
        for out in engine.step():
            if not args.json and (out.error or out.event.finish_reason):  # print each answer as it completes
                req = engine.requests[out.request_id]
                text = f"error: {out.error}" if out.error else req.seq.text
                print(f"--- [{out.request_id}] {prompts[ids.index(out.request_id)]!r}\n{text}\n")
    if args.json:
        for prompt, rid in zip(prompts, ids):
            req = engine.requests[rid]
            print(json.dumps({**req.seq.output().to_json(prompt), **req.metrics()}))
    print(f"[{engine.stats()}]", file=sys.stderr)
    return 0
