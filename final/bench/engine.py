"""Speculation inside the batch, on and off, side by side in one run.

    python -m course.final.bench.engine [--requests 8] [--max-output 64] [--concurrency 1 8]
                                        [--sections speculation features json rates] [--json out.json]
                                        [--rates 0.5 1 inf] [--plot rates.png]

Two workloads on the default model (greedy, chat template, EOS honoured so every system emits
the same tokens):
  chat     ShareGPT first turns (answers rarely quote the prompt: prompt lookup finds little)
  rewrite  "repeat/fix this text" requests (answers quote the prompt: lookup's best case)
At each concurrency (requests in flight at once; 1 = single stream) every system serves the
same requests: speculation off, prompt lookup and EAGLE (stage 05's head) with k = 2 and 4, and each with up
to k = 4 under the server's cost policy (speculation/policy.py). Printed: output tok/s,
the ratio to "off", drafted tokens accepted, and tokens emitted per verifying forward. Then,
on the chat workload at the highest concurrency, the engine's features one at a time (prefix
caching, chunked prefill, stage 06's runner against stage 04's engine, fused weights; the Triton
backend and CUDA graphs only where CUDA is: on the CPU the interpreter is not a speed).

`json`: requests for a JSON document under a `response_format`-style schema (stage 08's masks),
with the masks filled during the forward or after it, and with speculation; every grammar
system must emit the same tokens, and each output is checked to parse. Free text (no grammar)
is printed beside them for the cost of the masks (its tokens differ, so it is not compared).
`rates`: Poisson arrivals at several rates with transformers `generate` as the outside
baseline, TTFT/TPOT per request (bench_load.py); `--plot` draws throughput and CDFs.
"""
from __future__ import annotations

import argparse
import time

import torch

from course.s01_decode_loop.generate import encode_prompt
from course.s01_decode_loop.bench.measure import bench_cli
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s01_decode_loop.bench.workloads import sample_requests
from course.s06_kernels_graphs.engine import KernelEngineConfig

from .load import plot_rates, run_rates
from ..engine import Engine, SpeculativeConfig
from ..launch.kernel_defaults import kernel_defaults
from ..speculation.policy import CostModelPolicy

REWRITE = [
    "Fix the spelling in this text and repeat it: 'The quick brown fox jumpd over the lazy dog. It was a sunny day "
    "and the fox was verry happy to be outside in the feilds.'",
    "Repeat this list exactly, one item per line: apples, bananas, cherries, dates, elderberries, figs, grapes.",
    "Rewrite this sentence in the past tense: 'I walk to the market, I buy fresh bread, and I go home to eat it "
    "with my family.'",
    "Copy this code and add a comment on top: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
]
SYSTEMS = {"off": {}, "lookup k=2": dict(spec=SpeculativeConfig("lookup", 2)),
           "lookup k=4": dict(spec=SpeculativeConfig("lookup", 4)),
           "eagle k=2": dict(spec=SpeculativeConfig("eagle", 2)), "eagle k=4": dict(spec=SpeculativeConfig("eagle", 4)),
           # what the server runs: up to k per request, each step's lengths from measured costs (speculation/)
           "lookup k=4, cost policy": dict(spec=SpeculativeConfig("lookup", 4), policy=True),
           "eagle k=4, cost policy": dict(spec=SpeculativeConfig("eagle", 4), policy=True)}


# Engine features on and off (speculation off) on the chat workload, token budget 128 so that
# long prompts are chunked: each row changes one thing against the first, the engine as the
# server runs it (kernel_defaults.py; without chunking the budget must hold a whole prompt, so
# that row has 512).
FEATURES = {"all on (the server's defaults)": {}, "no prefix caching": {"enable_prefix_caching": False},
            "no chunked prefill (budget 512: whole prompts)": {"enable_chunked_prefill": False,
                                                               "max_num_batched_tokens": 512},
            "stage 04's engine (no ModelRunner)": {"engine": "stage04"}}
if not torch.cuda.is_available():
    FEATURES |= {"PyTorch attention (torch backend)": {"attention_backend": "torch"},
                 "unfused, linears unsplit (torch's linear)": {"fused": False, "linear_splits": 1},
                 "PyTorch only (torch backend, unfused, unsplit)": {"attention_backend": "torch", "fused": False,
                                                                    "linear_splits": 1}}
if torch.cuda.is_available():  # on the CPU these run through the interpreter / a checking stand-in
    FEATURES |= {"triton attention": {"attention_backend": "triton"},
                 "triton + fused + CUDA graphs": {"attention_backend": "triton", "fused": True, "cuda_graphs": True}}

JSON_PROMPTS = ["Describe a fictional person as JSON: name, age, city and two hobbies.",
                "Give me a JSON object for a book: title, author, year and a list of genres.",
                "Return JSON describing a city: name, country, population and three landmarks.",
                "Describe a pet as JSON with its name, species, age and favourite toys."]
JSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "kind": {"type": "string", "maxLength": 40},
    "number": {"type": "integer", "minimum": 0, "maximum": 100000000},
    "items": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4}},
    "required": ["name", "kind", "number", "items"]}
JSON_SYSTEMS = {"grammar, masks after the forward": dict(prefetch_masks=False),
                "grammar, masks during the forward": {},
                "grammar + lookup k=4": dict(spec=SpeculativeConfig("lookup", 4)),
                "grammar + eagle k=2": dict(spec=SpeculativeConfig("eagle", 2))}


def make_engine(loaded, concurrency: int, budget: int, spec=None, engine: str = "final", prefetch_masks=True,
                policy: bool = False, **features):
    sizes = dict(num_blocks=1024, max_num_seqs=concurrency, max_num_batched_tokens=budget, record_steps=False)
    if engine == "stage04":
        from course.s04_continuous_batching.engine import EngineConfig
        from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
        return BatchingEngine(loaded.model, loaded.tokenizer, EngineConfig(**sizes), loaded.eos_token_ids)
    config = KernelEngineConfig(**(sizes | kernel_defaults("cuda" if torch.cuda.is_available() else "cpu") | features))
    llm = Engine(loaded.model, loaded.tokenizer, config, loaded.eos_token_ids, spec, prefetch_masks=prefetch_masks)
    if policy:
        llm.draft_policy = CostModelPolicy()
    return llm


def serve(engine, prompts, max_output: int, grammar=None) -> dict:
    """Offline: every prompt at once. grammar(): a fresh grammar for one request, which rides on
    the request (final's Engine reads it to cut drafts and fill masks during the forward)."""
    params = SamplingParams(max_new_tokens=max_output, temperature=0.0)
    start = time.perf_counter()
    if grammar is None:
        outputs = engine.generate(prompts, params)
    else:
        ids = [engine.add_request(p, params, grammar=grammar()) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        outputs = [engine.requests[i].seq.output() for i in ids]
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    s = getattr(engine, "spec_stats", None)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "acceptance_rate": s.acceptance_rate if s else 0.0,
            "mean_accepted_length": s.mean_accepted_length if s else 0.0, "outputs": [o.token_ids for o in outputs],
            "texts": [o.text for o in outputs]}


def table(rows: list[dict], label: str, systems: dict, run, unchecked: tuple[str, ...] = ()) -> None:
    """Run each system, check it emits the first one's tokens (but those in `unchecked`, which
    change the output on purpose), print and keep a row each."""
    base = None
    for name, settings in systems.items():
        r = run(settings)
        base = base or r
        assert name in unchecked or r["outputs"] == base["outputs"], f"{name} changed the greedy output"
        row = {"label": label, "system": name, "vs_first": r["tok_s"] / base["tok_s"]} | \
            {k: v for k, v in r.items() if k not in ("outputs", "texts")}
        rows.append(row)
        print(f"{label:16s} {name:36s} {row['tok_s']:7.1f} tok/s  x{row['vs_first']:.2f}"
              f"  accepted {row['acceptance_rate']:.0%}  {row['mean_accepted_length']:.2f} tok/forward")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--sections", nargs="+", choices=["speculation", "features", "json", "rates"],
                   default=["speculation", "features", "json", "rates"])
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, float("inf")])
    p.add_argument("--plot", help="PNG for the rates section (throughput vs rate, TTFT/TPOT CDFs)")


def run(args: argparse.Namespace) -> dict:
    """Every section asked for; each row is printed as it is measured."""
    loaded = load_model()
    tok = loaded.tokenizer
    chat = [r.prompt for r in sample_requests(tok, args.requests, seed=0, max_prompt_tokens=256)]
    workloads = {"chat": chat, "rewrite": (REWRITE * args.requests)[:args.requests]}
    rows = []
    for workload, texts in workloads.items() if "speculation" in args.sections else ():
        prompts = [encode_prompt(tok, t, chat=True) for t in texts]
        for concurrency in args.concurrency:
            table(rows, f"{workload} c={concurrency}", SYSTEMS,
                  lambda system: serve(make_engine(loaded, concurrency, 512, **system), prompts, args.max_output))
    prompts = [encode_prompt(tok, t, chat=True) for t in workloads["chat"]]
    top = max(args.concurrency)
    if "features" in args.sections:
        table(rows, f"features c={top}", FEATURES,
              lambda features: serve(make_engine(loaded, top, 128, **features), prompts, args.max_output))
    if "json" in args.sections:
        json_section(rows, loaded, top, args.requests)
    if "rates" in args.sections:
        chat_work = [(encode_prompt(tok, r.prompt, chat=True), min(r.output_len, args.max_output))
                     for r in sample_requests(tok, args.requests, seed=0, max_prompt_tokens=256)]
        work = {"chat": chat_work, "rewrite": [(p, args.max_output) for p in
                                               (encode_prompt(tok, t, chat=True) for t in workloads["rewrite"])]}
        load_rows = run_rates(loaded, work, args.rates, lambda spec: make_engine(loaded, top, 256, spec))
        rows += load_rows
        if args.plot:
            plot_rates(load_rows, args.plot)
    return {"rows": rows}


def report(result: dict) -> None:
    print(f"{len(result['rows'])} rows (printed above as they were measured)")


def json_section(rows: list[dict], loaded, concurrency: int, n: int) -> None:
    """Grammar-constrained requests: masks during vs after the forward, with speculation; free text beside."""
    from course.s08_structured.generate import GrammarLogitsProcessor
    from course.s08_structured.json_schema import json_schema_to_grammar
    from course.s08_structured.matcher import compile_grammar
    from course.s08_structured.vocab import TokenizerInfo

    tok = loaded.tokenizer
    info = TokenizerInfo.from_huggingface(tok, loaded.model.config.vocab_size, loaded.eos_token_ids)
    compiled = compile_grammar(json_schema_to_grammar(JSON_SCHEMA), info)
    prompts = [encode_prompt(tok, t, chat=True) for t in (JSON_PROMPTS * n)[:n]]
    def grammar():
        return GrammarLogitsProcessor(compiled)
    def run(settings):
        settings = dict(settings)
        free = settings.pop("free_text", False)
        r = serve(make_engine(loaded, concurrency, 256, **settings), prompts, 128, None if free else grammar)
        r["valid_json"] = sum(_parses(t) for t in r["texts"]) / len(prompts)
        print(f"  {r['valid_json']:.0%} of outputs parse as JSON")
        return r
    free = "free text (no grammar)"
    table(rows, f"json c={concurrency}", JSON_SYSTEMS | {free: {"free_text": True}}, run, unchecked=(free,))


def _parses(text: str) -> bool:
    import json

    try:
        json.loads(text)
        return True
    except ValueError:
        return False


main = bench_cli(__doc__, add_args, run, report, module="course.final.bench.engine")

if __name__ == "__main__":
    main()
