"""Honest notebooks: re-execute a notebook and stamp it with what its outputs were computed from.

A notebook's saved outputs are only as good as the code that produced them. A stamp, stored in
the notebook's metadata under "course_freshness", records

  * `cells`:   a hash of the notebook's code cells (their exact text);
  * `modules`: a hash of every course module the notebook imports, directly or through other
               course modules (`course.sNN_name...` and `course.final...`, resolved through
               pyproject.toml's package-dir map), each package's `__init__.py` included, and of
               the package data those packages ship (pyproject.toml's package-data: stage 05's
               trained EAGLE head), byte for byte.

Module hashes are taken over the parsed code with docstrings removed (comments never reach the
parse tree), so editing prose does not make a notebook stale; changing code does.
tests/test_notebook_freshness.py recomputes both and fails when they differ from the stamp.

    python -m tests.stamp_notebooks                     # every stage notebook, one at a time
    python -m tests.stamp_notebooks stages/03_paged/paged.ipynb
    python -m tests.stamp_notebooks --full PATH         # without COURSE_QUICK=1 (the full sweeps)
    python -m tests.stamp_notebooks --full --write-results PATH   # ... and rewrite the results file
                                                                  # its README quotes (else left as committed)

The command executes the notebook top to bottom first, headless, as tests/test_notebooks.py
does (quick mode by default: COURSE_QUICK=1, and OMP_NUM_THREADS=1 unless you set it; a full run
uses every core, as a learner's would)
but with matplotlib's inline backend, so the saved outputs keep their plots. It refuses to stamp
a notebook that raised, and only then writes the outputs and the stamp. There is deliberately no way to stamp without executing.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import os
import re
import sys
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: read the one table we need by hand
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
KEY = "course_freshness"
VERSION = 1
COURSE_PREFIX = "course."


def notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks the course ships (the same list tests/test_notebooks.py executes)."""
    return sorted((root / "stages").glob("*/*.ipynb")) + sorted((root / "final").glob("*.ipynb"))


# ---- which files a notebook depends on ------------------------------------------------------
def package_dirs(root: Path) -> dict[str, Path]:
    """pyproject.toml's `[tool.setuptools.package-dir]`: importable name -> folder."""
    text = (root / "pyproject.toml").read_text()
    if tomllib is not None:
        mapping = tomllib.loads(text)["tool"]["setuptools"]["package-dir"]
    else:
        table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M).group(1)
        mapping = dict(re.findall(r'^"([^"]+)"\s*=\s*"([^"]+)"', table, re.M))
    return {name: root / folder for name, folder in mapping.items()}


def package_data(root: Path) -> dict[str, list[str]]:
    """pyproject.toml's `[tool.setuptools.package-data]`: importable name -> file patterns."""
    text = (root / "pyproject.toml").read_text()
    if tomllib is not None:
        return tomllib.loads(text).get("tool", {}).get("setuptools", {}).get("package-data", {})
    table = re.search(r"^\[tool\.setuptools\.package-data\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    return {name: re.findall(r'"([^"]+)"', patterns)
            for name, patterns in re.findall(r'^"([^"]+)"\s*=\s*\[([^\]]*)\]', table.group(1) if table else "", re.M)}


def module_file(name: str, dirs: dict[str, Path]) -> tuple[Path, bool] | None:
    """(file, is_package) for a course module name, or None if it is not one of ours."""
    for package, folder in sorted(dirs.items(), key=lambda kv: -len(kv[0])):  # longest prefix first
        if name == package:
            init = folder / "__init__.py"
            return (init, True) if init.is_file() else None
        if name.startswith(package + "."):
            path = folder.joinpath(*name[len(package) + 1:].split("."))
            if path.with_suffix(".py").is_file():
                return path.with_suffix(".py"), False
            if (path / "__init__.py").is_file():
                return path / "__init__.py", True
            return None
    return None


def strip_magics(code: str) -> str:
    """IPython magics and shell escapes are not Python; drop them before parsing."""
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def imported_names(source: str, module: str | None = None, is_package: bool = False) -> list[str]:
    """Every module name `source` imports, anywhere in it (function-local imports included).
    `from a import b` yields `a` and `a.b` (b may be a submodule). Relative imports are resolved
    against `module`."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if module is None:
                    continue
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base:
                names.append(base)
            names += [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
    return names


def dependencies(code: str, root: Path) -> list[Path]:
    """The course source files `code` imports, followed transitively, with the `__init__.py` of
    every package on the way (importing a.b.c runs a/__init__.py and a/b/__init__.py)."""
    dirs = package_dirs(root)
    seen: dict[Path, None] = {}
    todo = [n for n in imported_names(code) if n.startswith(COURSE_PREFIX)]
    done_names: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done_names:
            continue
        done_names.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]
        todo += [p for p in parents if p not in done_names]
        found = module_file(name, dirs)
        if found is None or found[0] in seen:
            continue
        path, is_package = found
        seen[path] = None
        todo += [n for n in imported_names(path.read_text(), name, is_package) if n.startswith(COURSE_PREFIX)]
    for package, patterns in package_data(root).items():  # data the imported packages ship
        if package in done_names and package in dirs:
            for pattern in patterns:
                seen.update(dict.fromkeys(sorted(dirs[package].glob(pattern))))
    return sorted(seen)


# ---- hashes ---------------------------------------------------------------------------------
def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def code_cells(nb) -> list[str]:
    return [cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for cell in nb["cells"] if cell["cell_type"] == "code"]


def cells_hash(nb) -> str:
    return _sha("\n# ---- next cell ----\n".join(code_cells(nb)))


def code_hash(source: str) -> str:
    """The hash of a module's code: its parse tree without docstrings (comments are not in it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return _sha(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return _sha(_dump(tree))


def _dump(node) -> str:
    """A parse tree as text, the same on every Python version this project supports: fields
    that are None or empty are left out (3.12 added empty `type_params`; 3.13's ast.dump drops
    empty fields), and so are contexts and `kind` (they follow from the rest)."""
    if isinstance(node, ast.AST):
        fields = [(name, getattr(node, name, None)) for name in node._fields if name not in ("ctx", "kind")]
        inner = ", ".join(f"{name}={_dump(value)}" for name, value in fields if value is not None and value != [])
        return f"{type(node).__name__}({inner})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(x) for x in node) + "]"
    return repr(node)


def fingerprint(nb, root: Path = ROOT) -> dict:
    """What a stamp records: the code cells' hash and every imported course module's hash."""
    code = strip_magics("\n".join(code_cells(nb)))
    return {"version": VERSION, "cells": cells_hash(nb),
            "modules": {str(p.relative_to(root)): file_hash(p) for p in dependencies(code, root)}}


def file_hash(path: Path) -> str:
    """Python source by its code (code_hash); any other file by its bytes."""
    if path.suffix == ".py":
        return code_hash(path.read_text())
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


# ---- the check and the stamp ----------------------------------------------------------------
def stamp(nb, root: Path = ROOT, quick: bool = True) -> None:
    """Write the stamp into `nb`'s metadata. Call it only on a notebook just executed (main does)."""
    nb["metadata"][KEY] = {**fingerprint(nb, root), "quick": quick,
                           "executed": datetime.date.today().isoformat()}


def problems(nb, root: Path = ROOT) -> list[str]:
    """Why `nb`'s saved outputs may not be what its code computes now (empty: fresh)."""
    saved = nb["metadata"].get(KEY)
    if not saved:
        return ["never stamped: its outputs may come from any version of the code"]
    if saved.get("version") != VERSION:
        return [f"stamped by an older version of the check ({saved.get('version')})"]
    now, found = fingerprint(nb, root), []
    if now["cells"] != saved["cells"]:
        found.append("its code cells changed since the outputs were saved")
    old, new = saved["modules"], now["modules"]
    found += [f"{f} changed" for f in sorted(old.keys() & new.keys()) if old[f] != new[f]]
    found += [f"{f} is imported now but was not when the outputs were saved" for f in sorted(new.keys() - old.keys())]
    found += [f"{f} was imported when the outputs were saved, no longer" for f in sorted(old.keys() - new.keys())]
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if any(c.get("execution_count") is None for c in cells if code_cells({"cells": [c]})[0].strip()):
        found.append("some code cells were never executed")
    if any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", [])):
        found.append("a saved output is an error")
    return found


def execute(path: Path, quick: bool = True, timeout: int = 900, write_results: bool = False):
    """Run the notebook top to bottom as tests/test_notebooks.py does; returns the executed notebook.
    A notebook rewrites the results file its README quotes only with write_results
    (COURSE_WRITE_RESULTS=1): a full run alone never overwrites committed figures."""
    import nbformat
    from nbclient import NotebookClient

    # The inline backend, as Jupyter uses: plt.show() saves each figure into the notebook as a
    # PNG (under Agg it would draw nothing, and the saved notebook would have no plots).
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    if quick:
        os.environ["COURSE_QUICK"] = "1"  # fewer tokens, smaller sweeps; the kernel inherits it
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as a test worker's share of a busy machine
    else:
        os.environ.pop("COURSE_QUICK", None)
    if write_results:
        os.environ["COURSE_WRITE_RESULTS"] = "1"
    else:
        os.environ.pop("COURSE_WRITE_RESULTS", None)
    nb = nbformat.read(path, as_version=4)
    before = fingerprint(nb)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    if errors:
        raise RuntimeError(f"{path}: a cell raised ({errors[0].get('ename')}: {errors[0].get('evalue')}); not stamped")
    if fingerprint(nb) != before:
        raise RuntimeError(f"{path}: the code changed while it ran; not stamped")
    return nb


def main(argv: list[str] | None = None) -> int:
    import nbformat

    p = argparse.ArgumentParser(prog="python -m tests.stamp_notebooks", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every stage notebook)")
    p.add_argument("--full", action="store_true", help="run without COURSE_QUICK=1 (the full sweeps)")
    p.add_argument("--check", action="store_true", help="only report which notebooks are stale; execute nothing")
    p.add_argument("--timeout", type=int, default=900, help="seconds one cell may run (stage 05's full sweep "
                                                            "needs more than 900 at one thread)")
    p.add_argument("--write-results", action="store_true",
                   help="let full runs rewrite the results files the READMEs quote (COURSE_WRITE_RESULTS=1)")
    args = p.parse_args(argv)
    paths = [path.resolve() for path in args.paths] or notebooks()
    if args.check:
        stale = 0
        for path in paths:
            found = problems(nbformat.read(path, as_version=4))
            stale += bool(found)
            print(f"{path.relative_to(ROOT)}: {'fresh' if not found else 'STALE: ' + '; '.join(found)}")
        return 1 if stale else 0
    for path in paths:
        print(f"executing {path.relative_to(ROOT)} ({'full' if args.full else 'quick'} mode) ...", flush=True)
        start = time.perf_counter()
        nb = execute(path, quick=not args.full, timeout=args.timeout, write_results=args.write_results)
        seconds = time.perf_counter() - start
        stamp(nb, quick=not args.full)
        nb["metadata"][KEY]["seconds"] = round(seconds, 1)
        note_run_time(nb, seconds, quick=not args.full)
        nbformat.write(nb, path)
        update_course_map(path)
        print(f"stamped {path.relative_to(ROOT)} ({seconds:.0f} s)", flush=True)
    return 0


RUN_NOTE = re.compile(r"\n*\*Saved outputs: .*?\*$", re.S)
SAVED_RUN = re.compile(r"Saved outputs: (quick|full) mode.*? in (\d+) s")


def update_course_map(path: Path) -> None:
    """Write the notebook's saved run ("93 s (full)") into its stage's row of the root README's
    course map (the last column), so the map quotes what Run All costs as measured."""
    import nbformat

    folder = path.parent
    runs = []
    for nb_path in sorted(folder.glob("*.ipynb")):
        top = next(c for c in nbformat.read(nb_path, as_version=4).cells if c.cell_type == "markdown").source
        found = SAVED_RUN.search(top)
        if found:
            runs.append(f"{found.group(2)} s ({found.group(1)})")
    name = "final/" if folder.name == "final" else folder.name
    readme = ROOT / "README.md"
    row = re.compile(rf"^(\| `{re.escape(name)}` \|[^|]*\|[^|]*\|)[^|]*\|$", re.M)
    readme.write_text(row.sub(lambda m: f"{m.group(1)} {', '.join(runs)} |", readme.read_text(), count=1))


def note_run_time(nb, seconds: float, quick: bool) -> None:
    """Say at the top of the notebook (its first markdown cell) how its outputs were made and how
    long that took, so a learner knows what to expect before pressing Run All."""
    cell = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if cell is None:
        return
    mode = "quick mode (`COURSE_QUICK=1`)" if quick else "full mode"
    note = (f"*Saved outputs: {mode}, executed top to bottom in {seconds:.0f} s on our 2-core x86_64 CPU "
            f"({datetime.date.today().isoformat()}).*")
    cell.source = RUN_NOTE.sub("", cell.source.rstrip()) + "\n\n" + note


if __name__ == "__main__":
    sys.exit(main())
