"""Token-mask cost on the default model's 49,152-token vocabulary: the naive reference, our
cached masks and xgrammar (PyPI, C++), side by side in one run.

    python -m course.s08_structured.bench.benchmark [--paths 4] [--max-tokens 48] [--naive-steps 3] [--results | --json out.json]

For each grammar (JSON schemas, regexes, EBNF grammars; testing.py's EXAMPLE_*):
  compile    our compile_grammar (automaton + every position's context-independent mask) and
             xgrammar's GrammarCompiler, each from the grammar's source
  mask       time of one next-token mask, per step, along the same valid token paths for
             all three (random valid outputs drawn from the mask; a fresh compile is timed, so
             nothing along the path is memoised beforehand); median and p99
  naive      the reference that walks every token, on the first --naive-steps steps of each path
  context    the share of (position, token) verdicts settled at compile time, and the mean
             number of uncertain tokens checked per step at run time
Then our compile time for the example schemas as written (with string length bounds): as the
lesson compiles (every position's mask now, the numpy walk) and as `final/`'s server does (the
automaton only, each mask made on a request's first visit by the walk in C, small rules kept
across schemas: serving/rule_cache.py, cold here).
"""
from __future__ import annotations

import argparse
import gc
import os
import random

import numpy as np

from course.s01_decode_loop.bench.measure import bench_cli, timed

from ..automaton import compile_automaton
from ..frontends.ebnf import parse_ebnf
from ..frontends.regex_parser import regex_to_grammar
from ..json_schema import json_schema_to_grammar
from ..matcher import GrammarMatcher, allocate_token_bitmask, compile_grammar, unpack_bitmask, write_bitmask
from ..naive import naive_token_mask
from .testing import (EXAMPLE_EBNF, EXAMPLE_REGEXES, EXAMPLE_SCHEMAS, random_valid_path, xgrammar_comparable,
                      xgrammar_compile, xgrammar_compiler)
from ..vocab import TokenizerInfo


def grammars() -> list[tuple[str, str, object]]:
    # Length bounds and formats dropped: xgrammar's differ from JSON's (testing.xgrammar_comparable).
    rows = [("json_schema", n, xgrammar_comparable(s)) for n, s in EXAMPLE_SCHEMAS.items()]
    rows += [("regex", n, r) for n, r in EXAMPLE_REGEXES.items()]
    return rows + [("ebnf", n, t) for n, t in EXAMPLE_EBNF.items()]


def build(kind: str, src):
    if kind == "json_schema":
        return json_schema_to_grammar(src)
    return regex_to_grammar(src) if kind == "regex" else parse_ebnf(src)


def timed_value(fn):
    """fn()'s result and the seconds it took (the harness's timer)."""
    box = []
    seconds = timed(lambda: box.append(fn()))
    return box[0], seconds


def stats_ms(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)), "steps": len(ms)}


def bench_grammar(kind, name, src, tokenizer, info, paths: int, max_tokens: int, naive_steps: int,
                  inline: bool = True) -> dict:
    import xgrammar as xgr

    x_compiler = xgrammar_compiler(tokenizer, info.vocab_size, cache_enabled=False)
    x_compiled, x_compile_s = timed_value(lambda: xgrammar_compile(x_compiler, src, kind))
    grammar = build(kind, src)
    parse_s = timed(lambda: build(kind, src))
    walker = compile_grammar(grammar, info, inline=inline)    # draws the paths
    rng = random.Random(name)
    token_paths = [random_valid_path(GrammarMatcher(walker), rng, max_tokens, end_bias=0.2) for _ in range(paths)]
    automaton_s = timed(lambda: compile_automaton(grammar, inline=inline))
    compiled, compile_s = timed_value(lambda: compile_grammar(grammar, info, inline=inline))  # fresh: nothing memoised
    ours, xg, naive, checked = [], [], [], []
    bitmask, x_bitmask = allocate_token_bitmask(1, info.vocab_size), xgr.allocate_token_bitmask(1, info.vocab_size)
    for path in token_paths:
        m, xm = GrammarMatcher(compiled), xgr.GrammarMatcher(x_compiled)
        for step, t in enumerate(path):
            # Both fill the same int32 bitmask layout: that is the work a decode loop waits for.
            s = timed(lambda: m.fill_next_token_bitmask(bitmask))
            ours.append(s)
            s = timed(lambda: xm.fill_next_token_bitmask(x_bitmask))
            xg.append(s)
            checked.append(_uncertain_checked(m))
            mask = unpack_bitmask(bitmask[0], info.vocab_size).numpy()
            if step < naive_steps:
                ref, s = timed_value(lambda: naive_token_mask(m))
                naive.append(s)
                assert np.array_equal(ref, mask)
            assert m.accept_token(t) and xm.accept_token(t)
    cache = mask_cache_stats(compiled)
    row = {"name": f"{kind}/{name}", "kind": kind, "grammar": name, "parse_s": parse_s, "compile_s": compile_s,
           "automaton_s": automaton_s, "xgrammar_compile_s": x_compile_s,
           **{k: cache[k] for k in ("positions", "cached_positions", "context_independent_share", "storage",
                                    "cache_bytes")},
           "uncertain_checked_per_step": float(np.mean(checked)) if checked else 0.0,
           "breakdown_ms": time_breakdown(compile_grammar(grammar, info, inline=inline), token_paths),
           "ours": stats_ms(ours), "xgrammar": stats_ms(xg), "naive": stats_ms(naive)}
    row["naive_over_ours"] = row["naive"]["median_ms"] / row["ours"]["median_ms"]
    row["ours_over_xgrammar"] = row["ours"]["median_ms"] / row["xgrammar"]["median_ms"]
    return row


def mask_cache_stats(compiled) -> dict:
    """What the compile settled ahead of time: positions, (position, token) verdicts accepted,
    rejected and uncertain, the share settled, and how the masks are stored (kinds, bytes)."""
    entries = list(compiled.masks.values())
    accepted, rejected = sum(e.num_accepted for e in entries), sum(e.num_rejected for e in entries)
    uncertain = sum(e.uncertain.size for e in entries)
    total = accepted + rejected + uncertain
    return {"positions": compiled.automaton.num_positions, "cached_positions": len(entries),
            "accepted": accepted, "rejected": rejected, "uncertain": uncertain,
            "context_independent_share": (accepted + rejected) / total if total else 1.0,
            "storage": {k: sum(e.kind == k for e in entries) for k in ("accepted", "rejected", "bitset")},
            "cache_bytes": sum(e.nbytes for e in entries)}


def time_breakdown(compiled, token_paths) -> dict:
    """Where a mask's time goes, in ms per step along `token_paths`: the union of the cached
    sets (an OR of packed words), walking the uncertain tokens, and writing the int32 bitmask."""
    parts = {"cached union": 0.0, "uncertain walks": 0.0, "write bitmask": 0.0}
    steps, bitmask = 0, allocate_token_bitmask(1, compiled.info.vocab_size)
    for path in token_paths:
        m = GrammarMatcher(compiled)
        for t in path:
            (words, candidates), s = timed_value(m.cached_part)
            parts["cached union"] += s
            parts["uncertain walks"] += timed(lambda: m.check_uncertain(words, candidates))
            parts["write bitmask"] += timed(lambda: write_bitmask(bitmask, 0, words))
            assert m.accept_token(t)
            steps += 1
    return {k: v / max(steps, 1) * 1e3 for k, v in parts.items()}


def _uncertain_checked(matcher: GrammarMatcher) -> int:
    """How many uncertain tokens the last mask had to walk (before de-duplication)."""
    masks = matcher.compiled.masks
    return sum(masks[p].uncertain.size for p in matcher.stack_tops() if p in masks)


def add_args(p: argparse.ArgumentParser) -> None:
    quick = bool(os.environ.get("COURSE_QUICK"))
    p.add_argument("--paths", type=int, default=2 if quick else 4)
    p.add_argument("--max-tokens", type=int, default=16 if quick else 48)
    p.add_argument("--naive-steps", type=int, default=1 if quick else 3)
    p.add_argument("--only", nargs="*", help="grammar names to run (default: all)")
    p.add_argument("--no-inline", action="store_true", help="keep every rule separate (what inlining buys)")


def run(args: argparse.Namespace) -> dict:
    """The benchmark: summary, rows, full_schema_compile (what --json and --results write)."""
    from transformers import AutoTokenizer

    from ..realworld.bench_coverage import served_classify
    from ..serving.rule_cache import cached_build_rule

    from course.s01_decode_loop.default_model import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152)
    rows = []
    for kind, name, src in grammars():
        if args.only and name not in args.only:
            continue
        rows.append(bench_grammar(kind, name, src, tokenizer, info, args.paths, args.max_tokens, args.naive_steps,
                                  inline=not args.no_inline))
    # The example schemas as written, with string length bounds and formats (xgrammar reads
    # those differently, so ours alone): a bounded string is one automaton copy per character.
    # As the server starts: the C walk loaded, and what is alive frozen out of the collector's walks
    # (final/'s freeze_startup_heap), so that no collection of this run's heap lands in a compile.
    compile_rows, classify = [], served_classify()
    gc.collect()
    gc.freeze()
    for name, schema in EXAMPLE_SCHEMAS.items():
        if args.only and name not in args.only:
            continue
        compiled, s = timed_value(lambda: compile_grammar(json_schema_to_grammar(schema), info))
        _, served = timed_value(lambda: compile_grammar(json_schema_to_grammar(schema), info, precompute=False,
                                                        minimize=False, classify=classify,
                                                        build_rule=cached_build_rule))
        compile_rows.append({"name": name, "schema": name, "compile_s": s, "served_compile_s": served,
                             "positions": compiled.automaton.num_positions})
    med = lambda key: float(np.median([r[key] for r in rows]))  # noqa: E731
    summary = {"vocab_size": info.vocab_size, "median_naive_over_ours": med("naive_over_ours"),
               "median_ours_over_xgrammar": med("ours_over_xgrammar")}
    return {"summary": summary, "rows": rows, "full_schema_compile": compile_rows}


def report(result: dict) -> None:
    print(f"{'grammar':<22}{'compile s':>10}{'xgr s':>8}{'ctx-indep':>10}{'ours med/p99 ms':>18}"
          f"{'xgr med/p99 ms':>17}{'naive med ms':>13}{'naive/ours':>11}{'ours/xgr':>9}")
    for r in result["rows"]:
        print(f"{r['kind'][:6] + ':' + r['grammar']:<22}{r['compile_s']:>10.2f}{r['xgrammar_compile_s']:>8.3f}"
              f"{r['context_independent_share']:>10.4f}"
              f"{r['ours']['median_ms']:>9.3f}/{r['ours']['p99_ms']:<8.2f}"
              f"{r['xgrammar']['median_ms']:>8.3f}/{r['xgrammar']['p99_ms']:<8.3f}{r['naive']['median_ms']:>13.0f}"
              f"{r['naive_over_ours']:>10.0f}x{r['ours_over_xgrammar']:>8.1f}x")
    for c in result["full_schema_compile"]:
        print(f"as written, json_schema:{c['schema']}: compile {c['compile_s']:.2f} s, {c['positions']} positions; "
              f"as served {1e3 * c['served_compile_s']:.1f} ms")
    summary = result["summary"]
    print(f"median over grammars: cached masks {summary['median_naive_over_ours']:.0f}x faster than naive, "
          f"{summary['median_ours_over_xgrammar']:.1f}x slower than xgrammar")


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.bench.benchmark")

if __name__ == "__main__":
    main()
