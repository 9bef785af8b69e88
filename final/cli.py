"""`python -m course.final serve`: the OpenAI-compatible server on the default model."""
from __future__ import annotations

import argparse
import sys

import torch

from course.s01_decode_loop.weights import ModelLoadError, load_model
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

from .async_engine import AsyncEngine
from .server import build_app


def build_server(args: argparse.Namespace):
    loaded = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    config = EngineConfig(num_blocks=args.kv_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_waiting=args.max_waiting,
                          record_steps=False)
    engine = AsyncEngine(LLMEngine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids))
    name = args.served_model_name or (args.model or "SmolLM2-135M-Instruct")
    return engine, build_app(engine, loaded.tokenizer, name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.final", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start the OpenAI-compatible server")
    s.add_argument("--model", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    s.add_argument("--served-model-name")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-num-seqs", type=int, default=32)
    s.add_argument("--max-num-batched-tokens", type=int, default=256)
    s.add_argument("--max-waiting", type=int, default=256, help="queue bound; beyond it requests get 429")
    s.add_argument("--kv-blocks", type=int, default=512)
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    import uvicorn

    try:
        engine, app = build_server(args)
    except (ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine.start()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        engine.shutdown()
    return 0
