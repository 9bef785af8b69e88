"""The command line every stage shares:

  python -m course.sNN_name --prompt "..." [--prompts-file F] [--chat] --max-new-tokens N
      [--temperature T --top-p P --top-k K --seed S] [--model PATH] [--json]

A stage passes its own `stream_fn(model, seq)` (how it turns a Sequence into tokens), or a
`make_stream(loaded, args)` that builds one (an engine with a KV pool, say) plus `add_args` for
its own flags; the common flags, output format and numbers stay the same from stage to stage.
If the stream has a `stats()` method, its result goes into the JSON as "stats".
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch

from .generate import encode_prompt, stream_naive
from .sampling import SamplingParams
from .sequence import Sequence, TokenEvent
from .weights import LoadedModel, ModelLoadError, load_model

StreamFn = Callable[[torch.nn.Module, Sequence], Iterator[TokenEvent]]


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    src = p.add_argument_group("prompts")
    src.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    src.add_argument("--prompts-file", type=Path,
                     help="one prompt per line, or JSON lines with a 'prompt' field")
    src.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    src.add_argument("--system", help="system message for --chat")
    s = p.add_argument_group("sampling")
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--seed", type=int)
    s.add_argument("--stop", action="append", default=[], help="stop string (repeat for several)")
    s.add_argument("--ignore-eos", action="store_true")
    m = p.add_argument_group("model")
    m.add_argument("--model", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    m.add_argument("--device", default="cpu")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming")
    return p


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        for line in args.prompts_file.read_text().splitlines():
            if line.strip():
                prompts.append(json.loads(line)["prompt"] if line.lstrip().startswith("{") else line)
    return prompts


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The common start of every stage's CLI: (prompts, SamplingParams, LoadedModel).
    Bad sampling values raise ValueError, a bad model ModelLoadError: callers print them."""
    prompts = read_prompts(args)
    if not prompts:
        parser.error("give at least one --prompt or a --prompts-file")
    params = sampling_params(args)
    return prompts, params, load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)


def main(argv: list[str] | None = None, stream_fn: StreamFn = stream_naive,
         description: str = "Stage 01: the naive decode loop (no KV cache).",
         make_stream: Callable[[LoadedModel, argparse.Namespace], StreamFn] | None = None,
         add_args: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    parser = build_parser(description)
    if add_args:
        add_args(parser)
    args = parser.parse_args(argv)
    try:
        prompts, params, loaded = prepare(parser, args)
        if make_stream:
            stream_fn = make_stream(loaded, args)
    except (ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for prompt in prompts:
        ids = encode_prompt(loaded.tokenizer, prompt, chat=args.chat, system=args.system)
        seq = Sequence(ids, params, loaded.tokenizer, loaded.eos_token_ids)
        try:
            for event in stream_fn(loaded.model, seq):
                if not args.json:
                    print(event.text, end="", flush=True)
        except ValueError as e:  # a request the engine refuses (too long for its cache, ...)
            print(f"error: {e}", file=sys.stderr)
            return 2
        out = seq.output()
        if args.json:
            row = out.to_json(prompt)
            if hasattr(stream_fn, "stats"):
                row["stats"] = stream_fn.stats()
            print(json.dumps(row), flush=True)
        else:
            print(f"\n[{len(out.token_ids)} tokens, finish={out.finish_reason}, TTFT {out.ttft_s * 1e3:.0f} ms, "
                  f"TPOT {out.tpot_s * 1e3:.0f} ms]", file=sys.stderr)
    return 0
