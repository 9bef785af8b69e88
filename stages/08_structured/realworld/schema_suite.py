"""The official JSON-Schema-Test-Suite (draft 2020-12) run against the JSON Schema front end.

The suite is a set of JSON files; each holds *cases* (a schema) with *tests* (an instance
and whether it is valid). For every case we compile the schema with `strict=False` (the
specification's reading):

    UnsupportedSchemaError   the case is unsupported; we count it under the feature named
    EmptySchemaError         the schema accepts nothing: every instance must be invalid
    a grammar                every instance is written canonically and must be accepted
                             exactly when the suite says it is valid

"Canonically" is the one spelling our grammars produce: json.dumps(ensure_ascii=False), 1.0
written as 1, and object keys reordered so that declared properties come first, in schema
order (in grammar-constrained output the property order is fixed, so an instance written in
another order is not a different value, just a spelling the grammar never emits).

The suite ships inside jsonschema's source distribution, which pip can fetch: the first run
downloads it once into ~/.cache/llm-inference-course (COURSE_MODEL_CACHE moves that folder,
COURSE_SCHEMA_SUITE points at an unpacked tests/draft2020-12 folder instead).

    python -m course.s08_structured.realworld.schema_suite [--mode best-effort] [--failures] [--results | --json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from course.s01_decode_loop.default_model import cache_root
from course.s01_decode_loop.bench.measure import bench_cli

from ..automaton import compile_automaton
from ..bench.testing import accepts
from ..json_schema import (MODES, STRICT, EmptySchemaError, SchemaError, UnsupportedSchemaError, canonical_json,
                          json_schema_to_grammar)
from ..json_schema.keywords import resolve_pointer
from ..pda import PDA

PACKAGE, VERSION, DRAFT = "jsonschema", "4.26.0", "draft2020-12"

# Suite cases ("file: case description") where we knowingly differ from the suite, and why.
# The test demands that the failures are exactly these: a new failure, or a fixed one, shows.
KNOWN_DIFFERENCES: dict[str, str] = {
    "vocabulary: schema that uses custom metaschema with with no validation vocabulary":
        "$schema is not read: a metaschema that switches validation off is not followed (we are stricter)",
}


class SuiteDownloadError(RuntimeError):
    """The suite could not be fetched (no network, no pip, an unexpected archive)."""


def suite_dir() -> Path:
    """The folder of draft 2020-12 test files, downloading them on first use."""
    override = os.environ.get("COURSE_SCHEMA_SUITE")
    if override:
        if not Path(override).is_dir():
            raise SuiteDownloadError(f"COURSE_SCHEMA_SUITE={override} is not a folder")
        return Path(override)
    out = cache_root() / f"JSON-Schema-Test-Suite-{PACKAGE}-{VERSION}" / DRAFT
    if not any(out.glob("*.json")):
        download_suite(out)
    return out


def download_suite(out: Path) -> None:
    """`pip download` jsonschema's sdist (never its dependencies) and keep only the suite's
    draft 2020-12 files (not optional/)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", f"{PACKAGE}=={VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob(f"{PACKAGE}-{VERSION}.tar.gz"))
        if proc.returncode or not archives:
            raise SuiteDownloadError(
                f"could not download {PACKAGE}=={VERSION}'s source archive with pip (it holds the "
                f"JSON-Schema-Test-Suite): {proc.stderr.strip()[-600:]}\nDownload it elsewhere and "
                f"set COURSE_SCHEMA_SUITE to its json/tests/{DRAFT} folder.")
        prefix = f"{PACKAGE}-{VERSION}/json/tests/{DRAFT}/"
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                rest = member.name[len(prefix):]
                if member.isfile() and member.name.startswith(prefix) and "/" not in rest and rest.endswith(".json"):
                    (staging / rest).write_bytes(tar.extractfile(member).read())
        if not any(staging.glob("*.json")):
            raise SuiteDownloadError(f"{archives[0].name} has no {prefix}*.json files")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)


# ------------------------------------------------------------------ canonical instances
def canonical_instance(value, schema, root) -> str:
    """The instance as our grammars would write it (declared properties first, in order)."""
    return canonical_json(_reorder(value, _applicable(schema, root), root))


def _applicable(schema, root, seen=None) -> list[dict]:
    """The schema and everything it pulls in ($ref, allOf, anyOf, oneOf), in the order the
    converter merges them, which is the order it writes their properties in."""
    seen = set() if seen is None else seen
    if not isinstance(schema, dict) or id(schema) in seen:
        return []
    seen.add(id(schema))
    out = [schema]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target = _pointer(root, ref)
        out += _applicable(target, root, seen) if target is not None else []
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, ()) if isinstance(schema.get(key), list) else ():
            out += _applicable(sub, root, seen)
    return out


def _pointer(root, ref: str):
    try:
        return resolve_pointer(root, unquote(ref[1:]))
    except KeyError:
        return None


def _reorder(value, schemas: list[dict], root):
    for literal in _literals(schemas):  # equal to an enum/const value: spelled as that literal
        if _same_value(literal, value):
            return literal
    if isinstance(value, dict):
        declared = [n for s in schemas if isinstance(s.get("properties"), dict) for n in s["properties"]]
        required = [n for s in schemas if isinstance(s.get("required"), list) for n in s["required"]]
        required += [n for s in schemas if isinstance(s.get("dependentRequired"), dict)  # names it may require
                     for names in s["dependentRequired"].values() if isinstance(names, list) for n in names]
        order = list(dict.fromkeys(declared + required))
        keys = [k for k in order if k in value] + [k for k in value if k not in order]
        return {k: _reorder(value[k], _below(schemas, _member_schema, k, root), root) for k in keys}
    if isinstance(value, list):
        return [_reorder(v, _below(schemas, _item_schema, j, root), root) for j, v in enumerate(value)]
    return value


def _same_value(a, b) -> bool:
    """JSON equality: 1 == 1.0, key order does not matter."""
    return json.dumps(json.loads(canonical_json(a)), sort_keys=True) == \
        json.dumps(json.loads(canonical_json(b)), sort_keys=True)


def _below(schemas, step, where, root) -> list[dict]:
    return [x for s in schemas for sub in step(s, where) for x in _applicable(sub, root)]


def _literals(schemas: list[dict]):
    for s in schemas:
        if "const" in s:
            yield s["const"]
        yield from s.get("enum", ()) if isinstance(s.get("enum"), list) else ()


def _member_schema(schema: dict, key: str) -> list:
    props = schema.get("properties")
    if isinstance(props, dict) and key in props:
        return [props[key]]
    return [schema["additionalProperties"]] if isinstance(schema.get("additionalProperties"), dict) else []


def _item_schema(schema: dict, j: int) -> list:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and j < len(prefix):
        return [prefix[j]]
    return [schema["items"]] if isinstance(schema.get("items"), dict) else []


# ------------------------------------------------------------------ running
def run_case(case: dict, mode: str = STRICT) -> dict:
    """One suite case: supported or not (and why), and each test's verdict. In best-effort
    mode a case compiled with a relaxation may accept an invalid instance ("loosened", not a
    failure), but must still accept every valid one."""
    schema = case["schema"]
    out = {"description": case["description"], "feature": None, "passed": 0, "failed": [], "relaxed": False,
           "loosened": 0}
    try:
        grammar = json_schema_to_grammar(schema, strict=False, mode=mode)
        out["relaxed"] = any(w.kind == "relaxed" for w in grammar.warnings)
        pda = PDA(compile_automaton(grammar))
    except UnsupportedSchemaError as e:
        out["feature"] = e.feature
        return out
    except EmptySchemaError:
        pda = None
    except SchemaError as e:  # the suite's schemas are valid: this is our mistake
        out["failed"] = [{"test": t["description"], "valid": t["valid"], "error": str(e)} for t in case["tests"]]
        return out
    for test in case["tests"]:
        text = canonical_instance(test["data"], schema, schema)
        try:
            ok = pda is not None and accepts(pda, text.encode())
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 output can contain it
            ok = False
        if ok == test["valid"]:
            out["passed"] += 1
        elif ok and out["relaxed"]:
            out["loosened"] += 1
        else:
            out["failed"].append({"test": test["description"], "valid": test["valid"], "text": text})
    return out


def run_suite(directory: Path | None = None, mode: str = STRICT) -> dict:
    directory = suite_dir() if directory is None else Path(directory)
    files, unsupported, failures = {}, Counter(), {}
    for path in sorted(directory.glob("*.json")):
        row = {"cases": 0, "supported": 0, "unsupported": 0, "passed": 0, "failed": 0, "relaxed": 0, "loosened": 0}
        for case in json.loads(path.read_text()):
            result = run_case(case, mode)
            row["cases"] += 1
            if result["feature"] is not None:
                row["unsupported"] += 1
                unsupported[result["feature"]] += 1
                continue
            row["supported"] += 1
            row["passed"] += result["passed"]
            row["failed"] += len(result["failed"])
            row["relaxed"] += result["relaxed"]
            row["loosened"] += result["loosened"]
            if result["failed"]:
                failures[f"{path.stem}: {case['description']}"] = result["failed"]
        files[path.stem] = row
    totals = {k: sum(r[k] for r in files.values()) for k in next(iter(files.values()))}
    return {"suite": f"JSON-Schema-Test-Suite {DRAFT} (from {PACKAGE} {VERSION}), {mode} mode", "files": files,
            "totals": totals, "unsupported_by_feature": dict(unsupported.most_common()), "failures": failures}


def print_report(report: dict, show_failures: bool = False) -> None:
    print(report["suite"])
    print(f"{'file':28} {'cases':>5} {'supp':>5} {'unsup':>5} {'pass':>5} {'fail':>5}")
    for name, r in [*report["files"].items(), ("TOTAL", report["totals"])]:
        print(f"{name:28} {r['cases']:5} {r['supported']:5} {r['unsupported']:5} {r['passed']:5} {r['failed']:5}")
    if report["totals"]["relaxed"]:
        print(f"best-effort: {report['totals']['relaxed']} supported cases relaxed a keyword; "
              f"{report['totals']['loosened']} invalid instances accepted because of it, 0 valid ones rejected "
              "unless listed below")
    print("unsupported cases by feature: " + ", ".join(f"{k} {v}" for k, v in report["unsupported_by_feature"].items()))
    for case, fails in report["failures"].items():
        known = KNOWN_DIFFERENCES.get(case)
        print(f"FAILED {case}" + (f" (known: {known})" if known else ""))
        if show_failures:
            for f in fails:
                print(f"    {f}")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dir", help="a folder of draft 2020-12 test files (default: download once)")
    ap.add_argument("--failures", action="store_true", help="print every failing test")
    ap.add_argument("--mode", choices=MODES, default=STRICT, help="strict (refuse what cannot be enforced) or "
                    "best-effort (relax it: invalid instances may be accepted there, valid ones never rejected)")


def run(args: argparse.Namespace) -> dict:
    return {**run_suite(args.dir, args.mode), "show_failures": args.failures}


def report(result: dict) -> None:
    print_report(result, result.get("show_failures", False))


main = bench_cli(__doc__, add_args, run, report, module="course.s08_structured.realworld.schema_suite")

if __name__ == "__main__":
    main()
