"""Do best-effort answers *finish*? Every real-world schema (realworld/schemas/*.json) through a
model, greedy, one fixed prompt, `--max-new-tokens` (256); per schema: valid & complete /
ran out of tokens / invalid, and for the ones that ran out, which construct the output was
inside when the budget ended (string, number, array, object).

    OMP_NUM_THREADS=1 python -m course.s08_structured.realworld.bench_finish                 # as shipped
    OMP_NUM_THREADS=1 python -m course.s08_structured.realworld.bench_finish --serving       # the fix
    OMP_NUM_THREADS=1 python -m course.s08_structured.realworld.bench_finish --compare       # as shipped, closing only, both
    python -m course.s08_structured.realworld.bench_finish --quick                           # tiny model, tests

`--results` writes results/bench_finish.json, `--json PATH` anywhere.

`--serving` = `--default-bounds` (serving-mode bounds where the schema gives none,
json_schema/defaults.py) + `--close-on-budget` (budget-aware closing, serving/closing.py); each
can be switched on alone.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema

import torch

from course.s01_decode_loop.bench.measure import bench_cli

REALWORLD = Path(__file__).parent / "schemas"
PROMPT = ("Reply with one JSON object that matches this JSON schema. Fill in realistic values.\n"
          "Schema:\n{schema}")


def open_construct(text: str) -> str:
    """What an unfinished JSON prefix is inside: 'string', 'number', 'array', 'object', 'literal'
    (true/false/null) or 'none' (nothing open). A small scanner, enough for our fixed spelling."""
    stack: list[str] = []
    in_string = escape = False
    scalar = None
    for ch in text:
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if scalar == "number" and (ch.isdigit() or ch in "+-.eE"):
            continue
        if scalar == "literal" and ch.isalpha():
            continue
        scalar = None
        if ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append("array" if ch == "[" else "object")
        elif ch in "]}":
            if stack:
                stack.pop()
        elif ch.isdigit() or ch == "-":
            scalar = "number"
        elif ch in "tfn":
            scalar = "literal"
    if in_string:
        return "string"
    if scalar:
        return scalar
    return stack[-1] if stack else "none"


def classify(text: str, finish_reason: str, validator, relaxed=()) -> tuple[str, str]:
    """(verdict, detail): 'ok' / 'closed' (valid and complete, but the budget ended it: shorter than
    the model would have written) / 'length' (+ the construct it was inside) / 'relaxed' (complete,
    but breaks only keywords best-effort reported as not enforced) / 'invalid' (+ why)."""
    try:
        value = json.loads(text)
    except ValueError:
        if finish_reason == "length":
            return "length", open_construct(text)
        return "invalid", "does not parse"
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        e = next((e for e in errors if e.validator not in relaxed), errors[0])
        verdict = "relaxed" if all(e.validator in relaxed for e in errors) else "invalid"
        return verdict, f"{e.validator} at /{'/'.join(map(str, e.absolute_path))}"
    # valid and complete, but ended by the budget: closed early to fit (finish_reason "length")
    return ("ok", "") if finish_reason == "stop" else ("closed", "closed to fit the budget")


def load_schemas(only=None) -> dict[str, dict]:
    out = {p.stem: json.loads(p.read_text()) for p in sorted(REALWORLD.glob("*.json"))}
    return {k: v for k, v in out.items() if not only or k in only}


def example_and_realworld_schemas() -> dict[str, dict]:
    """Stage 08's four example schemas and its twelve real-world ones: example/NAME, realworld/NAME."""
    from ..bench.testing import EXAMPLE_SCHEMAS

    return {**{f"example/{k}": v for k, v in EXAMPLE_SCHEMAS.items()},
            **{f"realworld/{k}": v for k, v in load_schemas().items()}}


def run_schemas(loaded, schemas: dict[str, dict], max_new_tokens: int, default_bounds, close_on_budget: bool,
        log=None, prompt: str = PROMPT) -> list[dict]:
    from course.s01_decode_loop.generate import encode_prompt, run_to_end
    from course.s01_decode_loop.sampling import SamplingParams

    from ..generate import ConstrainedGenerator
    from ..json_schema import json_schema_to_grammar
    from ..matcher import compile_grammar
    from ..serving.closing import CloseOnBudget
    from ..vocab import TokenizerInfo

    info = TokenizerInfo.from_huggingface(loaded.tokenizer, loaded.config.vocab_size, stop_ids=loaded.eos_token_ids)
    rows = []
    for name, schema in schemas.items():
        t0 = time.perf_counter()
        kwargs = {"default_bounds": default_bounds} if default_bounds is not None else {}
        grammar = json_schema_to_grammar(schema, mode="best-effort", **kwargs)
        compiled = compile_grammar(grammar, info, precompute=False)
        t1 = time.perf_counter()
        gen = ConstrainedGenerator(compiled, narrow=CloseOnBudget() if close_on_budget else None)
        ids = encode_prompt(loaded.tokenizer, prompt.format(schema=json.dumps(schema)),
                            chat=getattr(loaded.tokenizer, "chat_template", None) is not None)
        out = run_to_end(gen, loaded.model, loaded.tokenizer, ids,
                         SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0), loaded.eos_token_ids)
        validator = jsonschema.Draft202012Validator(schema)
        relaxed = {w.feature for w in grammar.warnings if w.kind == "relaxed"}
        verdict, detail = classify(out.text, out.finish_reason, validator, relaxed)
        rows.append({"schema": name, "verdict": verdict, "detail": detail, "finish_reason": out.finish_reason,
                     "tokens": len(out.token_ids), "compile_s": round(t1 - t0, 2),
                     "generate_s": round(time.perf_counter() - t1, 2), "text": out.text,
                     "default_bound_notes": sum(w.kind == "default-bound" for w in grammar.warnings)})
        if log:
            log(f"{name}: {verdict} {detail} ({len(out.token_ids)} tokens, {rows[-1]['generate_s']} s)")
    return rows


def summary(rows: list[dict]) -> dict:
    n = len(rows)
    count = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "closed", "relaxed", "length", "invalid")}
    return {**count, "n": n, "valid": count["ok"] + count["closed"],
            "fraction_ok": (count["ok"] + count["closed"]) / n if n else 0.0}


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: one row per schema, one column per configuration."""
    configs = list(results)
    lines = ["| schema | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    names = [r["schema"] for r in results[configs[0]]]
    for i, name in enumerate(names):
        cells = []
        for c in configs:
            r = results[c][i]
            cell = {"ok": "valid, complete", "closed": "valid, closed to fit", "length": "ran out", "invalid": "invalid",
                    "relaxed": "complete, breaks a relaxed keyword"}[r["verdict"]]
            cells.append(f"{cell}{' (' + r['detail'] + ')' if r['detail'] else ''}, {r['tokens']} tok")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **valid & complete** | " + " | ".join(
        f"**{summary(results[c])['valid']}/{summary(results[c])['n']}**" for c in configs) + " |")
    lines.append("| of them closed to fit the budget (finish_reason length) | " + " | ".join(
        str(summary(results[c])["closed"]) for c in configs) + " |")
    lines.append("| complete (valid, or breaking only a relaxed keyword) | " + " | ".join(
        f"{summary(results[c])['valid'] + summary(results[c])['relaxed']}/{summary(results[c])['n']}" for c in configs)
        + " |")
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--only", nargs="*", help="schema names (file stems)")
    p.add_argument("--default-bounds", action="store_true", help="serving-mode bounds where the schema has none")
    p.add_argument("--close-on-budget", action="store_true", help="budget-aware closing")
    p.add_argument("--serving", action="store_true", help="both of the above")
    p.add_argument("--compare", action="store_true", help="as shipped, closing only, --serving: one table")
    p.add_argument("--quick", action="store_true", help="a tiny random model and byte tokenizer (tests)")


@torch.no_grad()  # measuring only; a caller's own grad mode is left as it was
def run(args: argparse.Namespace) -> dict:
    """{"results": {configuration: rows}} for the configurations asked for."""
    from ..json_schema.defaults import SERVING_BOUNDS

    if args.quick:
        from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
        from course.s01_decode_loop.weights import LoadedModel
        loaded = LoadedModel(tiny_model("gqa_tied", seed=0), byte_tokenizer(), Path("."))
        args.max_new_tokens = min(args.max_new_tokens, 48)
        if not args.only:
            args.only = ["get_weather", "send_email"]
    else:
        from course.s01_decode_loop.weights import load_model
        loaded = load_model()
    schemas = load_schemas(args.only)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.compare:
        configs = {"as shipped": (None, False), "closing only": (None, True),
                   "serving (bounds + closing)": (SERVING_BOUNDS, True)}
    else:
        bounds = SERVING_BOUNDS if args.default_bounds or args.serving else None
        closing = args.close_on_budget or args.serving
        configs = {("bounds " if bounds else "") + ("closing" if closing else "") or "as shipped": (bounds, closing)}
    results = {}
    for label, (bounds, closing) in configs.items():
        log(f"== {label}")
        results[label] = run_schemas(loaded, schemas, args.max_new_tokens, bounds, closing, log,
                                     prompt="JSON:" if args.quick else PROMPT)  # the tiny model's context is 512
    return {"max_new_tokens": args.max_new_tokens, "results": results}


def report(result: dict) -> None:
    results = result["results"]
    print(table(results))
    for label in results:
        s = summary(results[label])
        print(f"{label}: {s['valid']}/{s['n']} valid & complete ({s['closed']} closed to fit the budget), "
              f"{s['relaxed']} complete but breaking a relaxed "
              f"keyword, {s['length']} ran out, {s['invalid']} invalid")


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.realworld.bench_finish")

if __name__ == "__main__":
    main()
