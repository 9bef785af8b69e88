"""Stage 01's CLI contract, run through the disaggregated topology; `serve` keeps it running.

    python -m course.s07_disaggregated --prompt "..." [--prefill 1 --decode 1 | --replicas N] [--json]
    python -m course.s07_disaggregated serve [--prefill 1 --decode 1 | --replicas N] [--policy P] [--port 8000]
    python -m course.s07_disaggregated --tensor-parallel-size N --prompt "..."   (tensor_parallel/cli.py)
    python -m course.s07_disaggregated worker --role prefill|decode|unified ...  (one worker process)

Both start the topology on this machine (P prefill + D decode worker processes, KV over
torch.distributed or a shared folder; or N unified replicas, no transfer). Then
  * with prompts (--prompt / --prompts-file), they run through it all at once, each one prefill
    worker -> decode worker (or one replica), print as the other stages do (--json: one object per
    prompt), and the workers stop;
  * `serve` without prompts serves POST /generate on --port until Ctrl-C, then stops the workers.
The launcher starts each worker as `... worker`: worker.py's process, with stage 04's watch plugged
in (a snapshot hook after each engine turn, GET /state and /events).
"""
from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from course.s01_decode_loop.cli import build_parser, read_prompts, sampling_params
from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.weights import ModelLoadError
from course.s04_continuous_batching.watch import EngineWatch
from course.s04_continuous_batching.watch.routes import add_watch_routes

from .dispatcher import Dispatcher
from .front import build_front_app
from .launcher import Topology
from .router import POLICIES
from .tensor_parallel.cli import run_tensor_parallel
from .worker import main as worker_main


def resolve_model_dir(name: str | None) -> Path:
    """The local folder every worker loads (converted once here, not by each worker at once)."""
    from course.s01_decode_loop.default_model import ensure_converted_gguf, ensure_default_model

    if name is None:
        return ensure_default_model()
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".gguf" and path.is_file():
        return ensure_converted_gguf(path)
    raise ModelLoadError(f"serve needs a local model folder or .gguf file, got {name!r}")


def parse_args(argv):
    parser = build_parser("Stage 07: prefill and decode in separate worker processes.")
    parser.add_argument("command", nargs="?", choices=["serve"],
                        help="serve: keep the topology running behind POST /generate until Ctrl-C")
    t = parser.add_argument_group("topology")
    t.add_argument("--prefill", type=int, default=1, help="prefill workers")
    t.add_argument("--decode", type=int, default=1, help="decode workers")
    t.add_argument("--replicas", type=int, default=0,
                   help="N unified workers (each runs prefill and decode itself, no transfer) instead of P + D")
    t.add_argument("--policy", choices=POLICIES, default="cache_aware",
                   help="how the prefill worker (or the replica) is chosen; decode workers: least-loaded")
    t.add_argument("--connector", choices=["p2p", "shared_storage"], default="p2p")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=8000, help="the dispatcher's port (when there are no prompts)")
    t.add_argument("--kv-blocks", type=int, default=256)
    t.add_argument("--block-size", type=int, default=16)
    t.add_argument("--max-num-batched-tokens", type=int, default=256)
    t.add_argument("--lease-s", type=float, default=30.0)
    t.add_argument("--log-dir", type=Path, help="keep the workers' logs here (default: a temporary folder, removed at exit)")
    t.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="N > 1: one engine, its model cut over N processes (tensor_parallel/), instead of workers")
    args = parser.parse_args(argv)
    if args.replicas < 0 or (args.replicas == 0 and min(args.prefill, args.decode) < 1):
        parser.error("need --prefill >= 1 and --decode >= 1, or --replicas >= 1")
    if args.command is None and not (args.prompt or args.prompts_file):
        parser.error("give at least one --prompt or a --prompts-file, or `serve` to run the topology until Ctrl-C")
    return parser, args


def plug_in_watch(app, loop) -> None:
    """Stage 04's watch on one worker: snapshots after each engine turn while someone reads them,
    served at GET /state and /events."""
    watch = EngineWatch()
    loop.after_turn.append(watch.turn)
    add_watch_routes(app, watch, lambda fn: asyncio.wrap_future(loop.submit(fn)), loop.running)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:], plug_ins=[plug_in_watch])
    parser, args = parse_args(argv)
    if args.tensor_parallel_size != 1:
        return run_tensor_parallel(args, resolve_model_dir)
    try:
        prompts, params = read_prompts(args), sampling_params(args)
        model_dir = resolve_model_dir(args.model)
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (ValueError, ModelLoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sampling = {k: v for k, v in asdict(params).items() if k != "logits_processors"}
    worker_args = ["--kv-blocks", str(args.kv_blocks), "--block-size", str(args.block_size),
                   "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--lease-s", str(args.lease_s)]
    replicas = args.replicas > 0
    with Topology(model_dir, 0 if replicas else args.prefill, 0 if replicas else args.decode, args.connector,
                  worker_args, args.log_dir, num_unified=args.replicas) as topology:
        for worker in topology.workers:
            print(f"{worker.role} worker: {worker.url} (pid {worker.process.pid})", file=sys.stderr, flush=True)
        urls = lambda ws: [w.url for w in ws]  # noqa: E731
        dispatcher = Dispatcher(urls(topology.prefill), urls(topology.decode), replicas=urls(topology.unified),
                                policy=args.policy, block_size=args.block_size,
                                router_options={"max_tree_tokens": args.kv_blocks * args.block_size})
        try:
            if prompts:
                return run_prompts(dispatcher, tokenizer, prompts, sampling, args)
            import uvicorn
            print(f"serving POST http://{args.host}:{args.port}/generate; Ctrl-C stops", file=sys.stderr, flush=True)
            uvicorn.run(build_front_app(dispatcher, tokenizer), host=args.host, port=args.port, log_level="warning")
            return 0  # uvicorn returns after Ctrl-C; leaving the `with` stops the workers
        finally:
            dispatcher.close()


def run_prompts(dispatcher: Dispatcher, tokenizer, prompts: list[str], sampling: dict, args) -> int:
    ids = [encode_prompt(tokenizer, p, args.chat, args.system) for p in prompts]

    def one(prompt_ids):
        try:
            return dispatcher.generate(prompt_ids, sampling)
        except Exception as e:  # this prompt failed; the others still print
            return {"error": str(e)}

    with ThreadPoolExecutor(min(8, len(prompts))) as pool:  # all at once: the workers batch them
        results = list(pool.map(one, ids))
    for prompt, prompt_ids, result in zip(prompts, ids, results):
        if not any(result.get("logprobs") or []):  # the CLI asks for none: drop the column of nulls
            result.pop("logprobs", None)
        if args.json:
            print(json.dumps({"prompt": prompt, "num_prompt_tokens": len(prompt_ids),
                              "num_generated_tokens": len(result.get("token_ids", [])), **result}))
        else:
            print(f"--- {prompt!r}\n{result.get('text', 'error: ' + result.get('error', ''))}\n")
    return 1 if any("error" in r for r in results) else 0
