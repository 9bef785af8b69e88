"""Invalid documents accepted (MaskBench's soundness measure): random walks over what each
engine's mask allows, every finished document checked with jsonschema.

    python -m course.s08_structured.realworld.bench_invalid [--walks 64] [--results]
    python -m course.s08_structured.realworld.bench_invalid --collection jsonschemabench --walks 16 --json F
    python -m course.s08_structured.realworld.bench_invalid --quick     # byte tokenizer (tests)

The schemas: stage 08's four examples and its twelve real-world ones, or (`--collection
jsonschemabench`) the 72 sampled from JSONSchemaBench's collections (realworld/jsonschemabench/).
Each compile gets the server's budget (a refusal is reported as the schema's error). For each schema and
engine (ours, xgrammar, llguidance; each with its own schema converter, our spelling: ", " and
": ", no other whitespace), `--walks` walks: at every step a token drawn uniformly from the ones
the engine's mask allows (a stop token, when allowed, with probability 1/2), until the engine
says the document is complete or `--max-tokens` pass (unfinished: not judged). A finished
document that does not parse or breaks its schema was wrongly accepted. Ours runs best-effort,
so a document that breaks only keywords it reported as relaxed counts apart ("relaxed"); so
does llguidance's, where it names keywords it does not implement and runs leniently without them.
"""
from __future__ import annotations

import argparse
import json
import random
import re

import numpy as np

from course.s01_decode_loop.bench.measure import bench_cli

COMPILE_TIMEOUT_S = 20.0  # as the server's --grammar-timeout


def judge(text: bytes, validator, relaxed=frozenset()) -> str:
    """'valid', 'relaxed' (breaks only keywords the compiler reported relaxing), 'invalid', or
    'unjudged' where jsonschema itself cannot check the value (a number past float's range, 1e999,
    is JSON but breaks its multipleOf arithmetic)."""
    try:
        value = json.loads(text)
    except ValueError:
        return "invalid"
    try:
        errors = list(validator.iter_errors(value))
    except (OverflowError, ValueError):
        return "unjudged"
    if not errors:
        return "valid"
    return "relaxed" if all(e.validator in relaxed for e in errors) else "invalid"


class Walker:
    """One engine's matcher behind three calls: mask(), take(token), done()."""

    def __init__(self, mask, take, done):
        self.mask, self.take, self.done = mask, take, done


def walk(walker: Walker, stop: set[int], rng: random.Random, max_tokens: int, token_bytes) -> bytes | None:
    """The bytes of one random document, or None when it did not finish within max_tokens."""
    out, stop_ids = bytearray(), sorted(stop)
    for _ in range(max_tokens):
        mask = np.array(walker.mask(), dtype=bool)  # a copy: the stop ids are cleared in it
        ends = [t for t in stop_ids if mask[t]]
        mask[stop_ids] = False
        others = np.flatnonzero(mask)
        if not ends and not others.size:
            return None
        t = rng.choice(ends) if ends and (not others.size or rng.random() < 0.5) else int(
            others[rng.randrange(others.size)])
        walker.take(t)
        if t in stop:
            return bytes(out)
        out += token_bytes[t]
        if walker.done():
            return bytes(out)
    return None


def walkers(schema: dict, info, tokenizer, x_compiler, ll_tokenizer) -> tuple[dict, dict]:
    """Each engine's fresh-walker factory for this schema (or the error that stopped it), and the
    keywords each engine reported relaxing."""
    from ..bench.testing import llguidance_mask, llguidance_matcher, xgrammar_compile, xgrammar_mask
    from ..budget import CompileBudget
    from ..json_schema import json_schema_to_grammar
    from ..matcher import GrammarMatcher, compile_grammar

    out, relaxed = {}, {}
    try:
        budget = CompileBudget(timeout_s=COMPILE_TIMEOUT_S)
        grammar = json_schema_to_grammar(schema, mode="best-effort", budget=budget)
        relaxed["ours"] = frozenset(w.feature for w in grammar.warnings if w.kind == "relaxed")
        compiled = compile_grammar(grammar, info, precompute=False, budget=budget)

        def ours():
            m = GrammarMatcher(compiled)
            return Walker(m.next_token_mask, m.accept_token, m.is_terminated)
        out["ours"] = ours
    except Exception as e:  # noqa: BLE001 - reported
        out["ours"] = f"{type(e).__name__}: {e}"[:160]
    try:
        import xgrammar as xgr
        x = xgrammar_compile(x_compiler, schema, "json_schema")

        def xg():
            m = xgr.GrammarMatcher(x)
            return Walker(lambda: xgrammar_mask(m, info.vocab_size), m.accept_token, m.is_terminated)
        out["xgrammar"] = xg
    except Exception as e:  # noqa: BLE001
        out["xgrammar"] = f"{type(e).__name__}: {e}"[:160]
    ll_relaxed = frozenset()
    try:
        try:
            first = llguidance_matcher(ll_tokenizer, schema, "json_schema")
        except ValueError as e:  # keywords it does not implement: ignored, as ours relaxes them
            ll_relaxed = frozenset(re.findall(r'"(\w+)"', str(e).partition("Unimplemented keys:")[2]))
            if not ll_relaxed:
                raise
            first = llguidance_matcher(ll_tokenizer, schema, "json_schema", lenient=True)

        def ll():
            m = first.deep_copy()
            return Walker(lambda: llguidance_mask(m, info.vocab_size), m.consume_token, m.is_stopped)
        out["llguidance"] = ll
    except Exception as e:  # noqa: BLE001
        out["llguidance"] = f"{type(e).__name__}: {e}"[:160]
    relaxed["llguidance"] = ll_relaxed
    return out, relaxed


def run(args: argparse.Namespace) -> dict:
    import jsonschema

    from ..bench.testing import format_checker, llguidance_tokenizer, xgrammar_compiler
    from ..vocab import TokenizerInfo
    from .bench_finish import example_and_realworld_schemas

    if args.quick:
        from course.s01_decode_loop.testing import TINY_EOS, byte_tokenizer
        tokenizer, vocab_size, stop = byte_tokenizer(), TINY_EOS + 1, [TINY_EOS]
    else:
        from transformers import AutoTokenizer

        from course.s01_decode_loop.default_model import ensure_default_model
        tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
        vocab_size, stop = 49152, [tokenizer.eos_token_id]
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_ids=stop)
    x_compiler = xgrammar_compiler(tokenizer, vocab_size)
    ll_tokenizer = llguidance_tokenizer(tokenizer, vocab_size)
    if args.collection == "jsonschemabench":
        from .bench_coverage import jsonschemabench_schemas
        schemas = jsonschemabench_schemas()
    else:
        schemas = example_and_realworld_schemas()
    if args.only:
        schemas = {k: v for k, v in schemas.items() if any(o in k for o in args.only)}
    rows = []
    for name, schema in schemas.items():
        validator = jsonschema.Draft202012Validator(schema, format_checker=format_checker())
        engines, relaxed = walkers(schema, info, tokenizer, x_compiler, ll_tokenizer)
        for engine, make in engines.items():
            row = {"schema": name, "engine": engine, "valid": 0, "relaxed": 0, "invalid": 0, "unjudged": 0,
                   "unfinished": 0, "examples": []}
            if isinstance(make, str):
                rows.append({**row, "error": make})
                continue
            rng = random.Random(f"{name}/{engine}")
            for _ in range(args.walks):
                text = walk(make(), set(stop), rng, args.max_tokens, info.token_bytes)
                verdict = "unfinished" if text is None else judge(text, validator, relaxed.get(engine, frozenset()))
                row[verdict] += 1
                if verdict == "invalid" and len(row["examples"]) < 3:
                    row["examples"].append(text.decode(errors="replace")[:300])
            rows.append(row)
            print(f"{name} {engine}: {row['valid']} valid, {row['relaxed']} relaxed, {row['invalid']} invalid, "
                  f"{row['unfinished']} unfinished", flush=True)
    summary = {}
    for engine in ("ours", "xgrammar", "llguidance"):
        theirs = [r for r in rows if r["engine"] == engine]
        mine = [r for r in theirs if "error" not in r]
        summary[engine] = {"schemas": len(mine), "not_compiled": len(theirs) - len(mine),
                           **{k: sum(r.get(k, 0) for r in mine)
                              for k in ("valid", "relaxed", "invalid", "unjudged", "unfinished")}}
    return {"collection": args.collection, "walks_per_schema": args.walks, "max_tokens": args.max_tokens,
            "summary": summary, "rows": rows}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--walks", type=int, default=64, help="random walks per schema and engine")
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--only", nargs="*", help="schema names (or substrings of them)")
    p.add_argument("--collection", choices=["examples", "jsonschemabench"], default="examples",
                   help="stage 08's examples and real-world schemas, or the JSONSchemaBench sample")
    p.add_argument("--quick", action="store_true", help="a byte-level tokenizer (258 tokens): for tests")


def report(result: dict) -> None:
    for engine, s in result["summary"].items():
        print(f"{engine:>10}: {s['schemas']} schemas ({s['not_compiled']} not compiled), "
              f"{s['valid'] + s['relaxed'] + s['invalid']} finished documents: "
              f"{s['invalid']} invalid accepted, {s['relaxed']} breaking only a reported relaxation, "
              f"{s['unjudged']} jsonschema could not check, {s['unfinished']} walks unfinished")


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.realworld.bench_invalid")

if __name__ == "__main__":
    main()
