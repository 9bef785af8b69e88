"""Honest notebooks: a notebook's saved outputs must come from the code as it is now.

Each notebook carries a stamp (tests/stamp_notebooks.py) with a hash of its code cells and of
every course module it imports, directly or not. If either changed since the outputs were
saved, the outputs may show what the code no longer computes: re-execute and restamp with
`python -m tests.stamp_notebooks PATH`. No notebook is executed here; this runs in a second.
"""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_stamp_notebooks", ROOT / "tests" / "stamp_notebooks.py")
stamps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stamps)


@pytest.mark.parametrize("path", stamps.notebooks(), ids=lambda p: p.parent.name)
def test_notebook_outputs_come_from_the_current_code(path):
    found = stamps.problems(nbformat.read(path, as_version=4))
    assert not found, (f"{path.relative_to(ROOT)}: " + "; ".join(found) +
                       f"\nre-execute and restamp it: python -m tests.stamp_notebooks {path.relative_to(ROOT)}")


# ---- the check itself, on copies made to fail -----------------------------------------------
def test_freshness_check_fails_on_an_edited_code_cell():
    nb = nbformat.read(ROOT / "stages/02_kv_cache/kv_cache.ipynb", as_version=4)
    stamps.stamp(nb)  # a copy in memory, as if just executed
    assert stamps.problems(nb) == []
    edited = copy.deepcopy(nb)
    cell = next(c for c in edited.cells if c.cell_type == "code")
    cell.source += "\nn_new = 1  # a deliberate change"
    assert stamps.problems(edited) == ["its code cells changed since the outputs were saved"]


def test_freshness_check_fails_on_an_unstamped_notebook_and_on_errors():
    nb = nbformat.read(ROOT / "stages/02_kv_cache/kv_cache.ipynb", as_version=4)
    nb.metadata.pop(stamps.KEY, None)
    assert stamps.problems(nb)[0].startswith("never stamped")
    stamps.stamp(nb)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[])]
    assert stamps.problems(nb) == ["a saved output is an error"]


@pytest.fixture
def mini_course(tmp_path):
    """A two-stage course in a temporary folder: stage 02's module imports stage 01's, and a
    notebook imports stage 02 only."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"course.s01_a" = "stages/01_a"\n"course.s02_b" = "stages/02_b"\n\n'
        '[tool.setuptools.package-data]\n"course.s01_a" = ["*.bin"]\n')
    s1, s2 = tmp_path / "stages/01_a", tmp_path / "stages/02_b"
    s1.mkdir(parents=True)
    s2.mkdir(parents=True)
    (s1 / "__init__.py").write_text("")
    (s1 / "model.py").write_text('"""The model."""\nfrom .helpers import double\n\ndef f(x):\n    return double(x)\n')
    (s1 / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (s1 / "unused.py").write_text("X = 1\n")
    (s1 / "weights.bin").write_bytes(b"\x00\x01")  # package data, like stage 05's EAGLE head
    (s2 / "__init__.py").write_text("")
    (s2 / "loop.py").write_text("from course.s01_a.model import f\n\ndef g(x):\n    return f(x) + 1\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# lesson"),
                nbformat.v4.new_code_cell("%matplotlib inline\nfrom course.s02_b import loop\nloop.g(1)",
                                          execution_count=1)]
    stamps.stamp(nb, tmp_path)
    return tmp_path, nb


def test_freshness_follows_imports_transitively(mini_course):
    root, nb = mini_course
    assert sorted(nb.metadata[stamps.KEY]["modules"]) == [
        "stages/01_a/__init__.py", "stages/01_a/helpers.py", "stages/01_a/model.py", "stages/01_a/weights.bin",
        "stages/02_b/__init__.py", "stages/02_b/loop.py"]  # not unused.py
    assert stamps.problems(nb, root) == []


def test_freshness_check_fails_when_an_imported_module_changes(mini_course):
    root, nb = mini_course
    helpers = root / "stages/01_a/helpers.py"
    helpers.write_text("def double(x):\n    return x + x + 0\n")  # two imports away from the notebook
    assert stamps.problems(nb, root) == ["stages/01_a/helpers.py changed"]


def test_freshness_ignores_comments_and_docstrings(mini_course):
    root, nb = mini_course
    model = root / "stages/01_a/model.py"
    model.write_text('"""The model, now better explained."""\nfrom .helpers import double  # a comment\n\n'
                     'def f(x):\n    """Twice x."""\n    return double(x)\n')
    (root / "stages/01_a/unused.py").write_text("X = 2\n")  # not imported: does not matter
    assert stamps.problems(nb, root) == []


def test_freshness_notices_a_new_import(mini_course):
    root, nb = mini_course
    (root / "stages/01_a/helpers.py").write_text("from .unused import X\n\ndef double(x):\n    return 2 * x\n")
    assert stamps.problems(nb, root) == [
        "stages/01_a/helpers.py changed",
        "stages/01_a/unused.py is imported now but was not when the outputs were saved"]


def test_freshness_check_fails_when_shipped_data_changes(mini_course):
    root, nb = mini_course
    (root / "stages/01_a/weights.bin").write_bytes(b"\x00\x02")  # a retrained head, say
    assert stamps.problems(nb, root) == ["stages/01_a/weights.bin changed"]
