"""`python -m course.final serve`: the OpenAI-compatible server on the default model.
`python -m course.final serve --disaggregated --prefill 1 --decode 1`: the same API over stage 07's workers.

The one place that assembles everything: the engine with stage 06's rooms (launch/), the
scheduling policy (scheduling/), and the app with every room's plug-in (`plugins`)."""
from __future__ import annotations

import argparse
import sys
from functools import partial

from course.s01_decode_loop.weights import ModelLoadError, load_model
from course.s02_kv_cache.kv_size import human
from course.s03_paged.layer_groups import group_blocks, layer_groups
from course.s03_paged.quantized_kv import KV_CACHE_DTYPES, pool_bytes_per_token, storage_dtype
from course.s04_continuous_batching.hybrid.states import linear_layers, state_bytes
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s07_disaggregated.router import POLICIES as ROUTING_POLICIES
from course.s08_structured.json_schema import BEST_EFFORT, SERVING_BOUNDS, STRICT, json_schema_to_grammar
from course.s08_structured.native.walker import native_classifier
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.serving.rule_cache import cached_build_rule

from . import compat, dashboard, harness, reasoning, responses_api, tools
from .async_engine import AsyncEngine
from .engine import METHODS, Engine, SpeculativeConfig
from .launch.kernel_defaults import describe as describe_kernels
from .launch.kernel_defaults import pick_device, pick_dtype
from .launch.kernel_options import add_kernel_args, graph_options, kernel_options, warm_up
from .launch.sizing import cpu_kv_bytes, step_sizes
from .launch.heap import freeze_startup_heap
from .launch.kv_pool import describe_windows, grouped_kv_blocks, hybrid_memory, parse_size
from .launch.model_fit import engine_class, fit_options
from .scheduling.policies import POLICIES, scheduling_policy
from .speculation.policy import CostModelPolicy
from .speculation.trees import TreeDrafting
from .security.api_key import Door, guard
from .security.options import add_door_args, door_from_args, uvicorn_options
from .metrics import ServerMetrics
from .disaggregated.remote_engine import LOCAL_ONLY, check_flags, serve_disaggregated
from .server import ServerLimits, build_app
from .shutdown import serve_until_stopped
from .tensor_parallel.start import start_tensor_parallel
from .torch_threads import off_the_main_thread


def schema_grammar(schema, strict: bool, budget):
    """`response_format`'s compiler: stage 08's JSON Schema front end. Strict refuses a keyword no
    grammar enforces; best-effort relaxes it (the warnings header says so) and bounds the strings,
    numbers and arrays the schema leaves unbounded (SERVING_BOUNDS: 64 characters, 16 digits,
    16 items, each listed in the header as a "default-bound"), so that answers finish."""
    return json_schema_to_grammar(schema, budget=budget, mode=STRICT if strict else BEST_EFFORT,
                                  default_bounds=SERVING_BOUNDS)


def plug_in_json_schema(app, server) -> None:
    """The grammar cache's JSON Schema compiler, and processors that close the JSON on budget:
    when the tokens left in max_tokens are about what the shortest way to close it needs, only
    tokens that still let it close are allowed (a valid document; "length" if it was closed early).
    A position's mask is made by stage 08's walk in C where a compiler is found (native/: a new
    schema's slowest masks come 12x sooner: stage 08's results/bench_coverage.json), and the small
    rules every schema has (`string_max64`, `number`, ...) are built once (serving/rule_cache.py)."""
    server.grammars.schema_grammar = schema_grammar
    server.grammars.narrow = CloseOnBudget()
    server.grammars.classify = native_classifier() or server.grammars.classify
    server.grammars.build_rule = cached_build_rule


def plugins(door: Door | None = None, dashboard_routes: bool = True, reasoning_parser: str = "auto",
            responses_store_size: int = responses_api.STORE_SIZE) -> list:
    """Every room's plug-in of the full server; the door last, so its key check is the outermost.
    reasoning/ comes after tools/ and harness/: it splits the answer they shape and wraps the chat
    answer they take over."""
    return [plug_in_json_schema, tools.plug_in, harness.plug_in, compat.plug_in,
            reasoning.plug_in_for(reasoning_parser),
            partial(responses_api.plug_in, store_size=responses_store_size)] + \
        [dashboard.plug_in] * dashboard_routes + [guard(door)]


def assemble_app(engine, tokenizer, model_name: str, limits: ServerLimits | None = None, door: Door | None = None,
                 dashboard_routes: bool = True, reasoning_parser: str = "auto",
                 responses_store_size: int = responses_api.STORE_SIZE):
    """The full server's app over `engine` (the tests' live servers are this one too)."""
    return build_app(engine, tokenizer, model_name, limits, plugins(door, dashboard_routes, reasoning_parser,
                                                                    responses_store_size))


def ready_to_serve(app) -> None:
    """The last steps before answering: the grammar tables made, then the start-up heap frozen."""
    app.state.grammars.prepare()
    freeze_startup_heap()


def build_server(args: argparse.Namespace, memory_info=None, tp=None):
    """The engine, its model loaded, its graphs captured, and the app; `memory_info` as
    torch.cuda.mem_get_info (tests pass a fake card); `tp`: rank 0's TensorParallel, or None."""
    args.device = device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    kv_dtype = storage_dtype(args.kv_cache_dtype, dtype)
    # typos fail before the model loads
    kv_memory = parse_size(args.kv_memory, "--kv-memory") if args.kv_memory is not None else None
    kv_source = "--kv-memory"
    if not device.startswith("cuda") and kv_memory is None and args.kv_blocks is None:
        kv_memory, kv_source = cpu_kv_bytes()  # the pool sized from this machine's memory (launch/sizing.py)
    sizes = step_sizes(args, device)
    max_request_bytes = parse_size(args.max_request_bytes, "--max-request-bytes")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], not {args.gpu_memory_utilization}")
    if args.speculative_tree and args.speculative_method != "eagle":
        raise ValueError("--speculative-tree needs --speculative-method eagle (an EAGLE head drafts the trees)")
    policy = scheduling_policy(args)  # reads the cost model: a bad path fails before the model loads
    options = kernel_options(args)
    print(f"device {device}, {str(dtype).removeprefix('torch.')}; " + describe_kernels(options, device, dtype),
          file=sys.stderr)
    speculative = SpeculativeConfig(args.speculative_method, args.num_speculative_tokens,
                                    eagle_head=getattr(args, "speculative_model", None),
                                    disable_by_batch_size=args.speculative_disable_by_batch_size)

    def load_engine():  # every parallel torch op of the start-up, on a thread that then exits (torch_threads.py)
        loaded = tp.load_shard()[0] if tp else load_model(args.model, dtype=dtype, device=device)
        loaded.tokenizer.chat_template = getattr(args, "chat_template", None) or loaded.tokenizer.chat_template
        pool_memory, hybrid = kv_memory, {}
        if linear_layers(loaded.model.config):  # a hybrid model: its linear layers' states (stage 04's hybrid/)
            per_sequence = state_bytes(loaded.model.config)
            if kv_memory is not None:
                pool_memory, snapshots, line = hybrid_memory(kv_memory, per_sequence, args.max_num_seqs)
                hybrid = {"max_state_snapshots": snapshots}
            else:
                line = f"state cache: {human(per_sequence)} of recurrent state a sequence"
            print(f"{line}; snapshots every {args.block_size} tokens", file=sys.stderr)
        fitted, notes = fit_options(options, args, loaded.model)
        for note in notes:
            print(f"kernels: {note}", file=sys.stderr)
        # sliding layers beside full ones: a pool per layer group (stage 03), unless graphs share one table
        groups = [] if fitted.get("cuda_graphs") else layer_groups(loaded.model.config.layer_windows)
        blocks = grouped_kv_blocks(args, pool_memory, loaded.model.config, dtype, groups, device=device,
                                   memory_info=memory_info, reserved_blocks=LLMEngine.reserved_blocks, kv_dtype=kv_dtype)
        per_token = pool_bytes_per_token(loaded.model.config, kv_dtype)
        print(f"KV cache: {blocks} blocks of {args.block_size} tokens ({blocks * args.block_size} tokens"
              + (f"; {human(kv_memory)}: {kv_source}" if kv_memory is not None else "")
              + f"; {str(kv_dtype).removeprefix('torch.')}, {human(per_token)} a token in every layer); {sizes}",
              file=sys.stderr)
        pools = group_blocks(groups, blocks, args.block_size, args.max_num_seqs, args.max_num_batched_tokens)
        if windows := describe_windows(loaded.model.config, args.block_size,
                                       [(w, layers, n) for (w, layers), n in zip(groups, pools)]):
            print(f"KV cache: {windows}", file=sys.stderr)
        config = KernelEngineConfig(num_blocks=blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                                    kv_cache_dtype=args.kv_cache_dtype,
                                    max_num_batched_tokens=args.max_num_batched_tokens, max_waiting=args.max_waiting,
                                    record_steps=False, **graph_options(args, blocks), **fitted)
        llm = engine_class(loaded.model, Engine)(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids,
                                                 speculative, policy=policy, **hybrid)
        if speculative.method != "none" and args.speculative_policy == "cost":
            llm.draft_policy = CostModelPolicy()
        if args.speculative_tree:
            llm.trees = TreeDrafting(llm, args.speculative_tree_nodes)
        if tp:  # every rank builds the same runner and pool; each step is broadcast from here
            tp.attach(llm)
        warm_up(llm)
        return loaded, llm

    loaded, llm = off_the_main_thread(load_engine)
    name = args.served_model_name or (args.model or "SmolLM2-135M-Instruct")
    engine = AsyncEngine(llm, ServerMetrics(name))
    limits = ServerLimits(max_request_bytes=max_request_bytes, grammar_timeout_s=args.grammar_timeout)
    return engine, assemble_app(engine, loaded.tokenizer, name, limits, door_from_args(args), not args.no_dashboard,
                                getattr(args, "reasoning_parser", "auto"), args.responses_store_size)


def make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line and its `serve` sub-command."""
    p = argparse.ArgumentParser(prog="python -m course.final", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start the OpenAI-compatible server")
    s.add_argument("--model", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    s.add_argument("--served-model-name")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-num-seqs", type=int,
                   help="requests in a batch (default: 128 on the CPU, 32 on CUDA; launch/sizing.py)")
    s.add_argument("--max-num-batched-tokens", type=int,
                   help="tokens in a step (default: 256; launch/sizing.py)")
    s.add_argument("--max-waiting", type=int, default=256, help="queue bound; beyond it requests get 429")
    kv = s.add_mutually_exclusive_group()
    kv.add_argument("--kv-blocks", type=int,
                    help="KV cache size in blocks (default: on CUDA what --gpu-memory-utilization leaves; on the CPU "
                         "$VLLM_CPU_KVCACHE_SPACE GiB, else 10%% of the memory available, at most 4 GiB)")
    kv.add_argument("--kv-memory", help="KV cache size in bytes instead, e.g. 512MiB")
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="on CUDA, the share of the card the server may fill: weights, a step's activations, "
                        "graphs, and the KV cache in what is left")
    s.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="what the KV cache stores: auto (the model's --dtype), float32, bfloat16, or int8 / fp8 "
                        "codes with a scale per token and KV head (~3.9x the tokens of float32 in the same memory)")
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--device", default="auto", help="auto (CUDA when torch sees a card, else cpu), cpu, cuda, cuda:N")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights and KV cache; auto: bfloat16 on CUDA, float32 on the CPU")
    add_kernel_args(s)
    sp = s.add_argument_group("speculative decoding (stage 05, inside the batch)")
    sp.add_argument("--speculative-method", choices=METHODS, default="none",
                    help="lookup: prompt lookup (vLLM's ngram); eagle: stage 05's EAGLE head (trained for SmolLM2-135M)")
    sp.add_argument("--num-speculative-tokens", type=int, default=4, help="drafts per request per step")
    sp.add_argument("--speculative-model", metavar="HEAD",
                    help="the EAGLE head file (default: stage 05's, trained for SmolLM2-135M-Instruct)")
    sp.add_argument("--speculative-disable-by-batch-size", type=int,
                    help="no speculation in steps with more running requests than this")
    sp.add_argument("--speculative-tree", action="store_true",
                    help="greedy requests draft EAGLE-2 trees, --num-speculative-tokens deep (eagle only)")
    sp.add_argument("--speculative-tree-nodes", type=int, default=8, help="at most this many nodes a tree")
    sp.add_argument("--speculative-policy", choices=["cost", "fixed"], default="cost",
                    help="cost: each request's draft length per step from measured costs and its acceptance "
                         "(final/speculation/); fixed: k for every request")
    sc = s.add_argument_group("scheduling (stage 04's seam; final/scheduling/policies.py)")
    sc.add_argument("--scheduling-policy", choices=POLICIES, default="fcfs",
                    help="fcfs; priority (vLLM's: the request's `priority`, lower first); mlfq (FastServe's skip-join MLFQ)")
    sc.add_argument("--cost-model", help="MLFQ's cost model, a JSON from `python -m course.final.scheduling.cost_model` "
                                         "(default: the one measured on our 2-core CPU)")
    sc.add_argument("--mlfq-base-quantum", type=float, help="seconds of service at level 0 (default: one decode step)")
    sc.add_argument("--mlfq-ratio", type=float, default=2.0, help="quantum of level i: base * ratio**i")
    sc.add_argument("--mlfq-levels", type=int, default=8)
    sc.add_argument("--mlfq-starvation", type=float,
                    help="seconds unserved before a request returns to level 0 (default: 100 x the last quantum)")
    s.add_argument("--chat-template", help="a Jinja file to use instead of the model's chat template (tools/render.py)")
    reasoning.add_args(s)
    s.add_argument("--max-request-bytes", default="2MiB", help="larger request bodies get 413")
    s.add_argument("--grammar-timeout", type=float, default=20.0,
                   help="seconds a response_format schema may take to compile (then 400)")
    add_door_args(s)
    responses_api.add_args(s)
    s.add_argument("--no-dashboard", action="store_true", help="no /dashboard, /dashboard/events, /v1/engine/state")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/Ctrl-C, seconds requests in flight get to finish before they are stopped")
    d = s.add_argument_group("disaggregated (stage 07's workers behind the API; final/disaggregated/remote_engine.py)")
    d.add_argument("--disaggregated", action="store_true",
                   help="run the model in stage 07 worker processes: P prefill + D decode workers, or N replicas")
    d.add_argument("--prefill", type=int, help="prefill workers (default 1)")
    d.add_argument("--decode", type=int, help="decode workers (default 1)")
    d.add_argument("--replicas", type=int, help="N unified workers instead (each runs whole requests, no KV transfer)")
    d.add_argument("--routing-policy", choices=ROUTING_POLICIES,
                   help="how the prefill worker (or replica) is chosen (default cache_aware); decode: least-loaded")
    t = s.add_argument_group("tensor parallel (stage 07's tensor_parallel room; final/tensor_parallel/start.py)")
    t.add_argument("--tensor-parallel-size", type=int, default=1, help="cut the model over N processes (gloo/NCCL)")
    t.add_argument("--tp-timeout", type=float, default=60.0, help="seconds a collective may wait before the server stops")
    return p, s


def main(argv: list[str] | None = None) -> int:
    p, s = make_parser()
    args = p.parse_args(argv)

    try:
        check_flags(args, {name: s.get_default(name) for name in LOCAL_ONLY})
        args.chat_template = args.chat_template and open(args.chat_template).read()  # read before the model loads
        tp = start_tensor_parallel(args)  # None for one process; refuses what TP does not combine with
    except (ValueError, OSError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.disaggregated:
        return serve_disaggregated(args, partial(assemble_app, responses_store_size=args.responses_store_size))
    try:
        engine, app = build_server(args, tp=tp)
    except (ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        if tp:
            tp.close()
        return 2
    engine.start()
    ready_to_serve(app)
    try:
        serve_until_stopped(app, engine, args.host, args.port, args.drain_timeout, **uvicorn_options(args.host, app.state.door))
    finally:
        if tp:
            tp.close()
    return 1 if tp and tp.leader.broken else 0
