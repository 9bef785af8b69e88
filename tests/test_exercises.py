"""The exercise switch (`pytest --exercise`, root conftest.py): learner stubs in
stages/NN_name/exercises/ take the reference's place only when asked, and then the stage's tests
really run them (the stubs raise NotImplementedError, so those tests fail)."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_root_conftest", ROOT / "conftest.py")
switch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(switch)
EXERCISES = switch.exercise_files()


def stubs_of(path: Path) -> list[tuple[str, object, object]]:
    """(name, stub, reference) for every function the exercise file writes (methods as Class.name)."""
    stubs, ref, found = switch.load_exercise(path), switch.reference_module(path), []
    for name, obj in vars(stubs).items():
        if getattr(obj, "__module__", None) != stubs.__name__:
            continue
        if inspect.isfunction(obj):
            found.append((name, obj, getattr(ref, name)))
        elif inspect.isclass(obj):
            found += [(f"{name}.{m}", fn, getattr(getattr(ref, name), m))
                      for m, fn in vars(obj).items() if inspect.isfunction(fn)]
    return found


def test_two_stages_have_exercises():
    assert {p.parent.parent.name for p in EXERCISES} >= {"03_paged", "05_speculative"}


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_exercise_stubs_match_the_reference_and_only_raise(path):
    found = stubs_of(path)
    assert len(found) >= 2
    for name, stub, ref in found:
        assert inspect.signature(stub) == inspect.signature(ref), f"{name}: the stub's signature differs"
        assert inspect.getdoc(stub), f"{name}: a stub tells the learner what to write"
        body = ast.parse(inspect.cleandoc("\n" + inspect.getsource(stub))).body[0].body
        assert isinstance(body[-1], ast.Raise) and "NotImplementedError" in ast.unparse(body[-1]), \
            f"{name}: a stub only raises NotImplementedError"


def test_the_reference_runs_unless_asked(request):
    if request.config.getoption("--exercise"):
        pytest.skip("this run was asked for the exercises")
    for path in EXERCISES:
        for name, _, ref in stubs_of(path):
            assert Path(inspect.getsourcefile(ref)).parent.name != "exercises", name


def test_with_the_switch_the_stages_tests_run_the_stubs_and_fail():
    tests = ["stages/03_paged/tests/test_block_manager.py", "stages/05_speculative/tests/test_verify.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", *tests, "--exercise", "-p", "no:cacheprovider",
                          "--tb=line", "-rf"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]  # 1: tests failed (not a crash, not a usage error)
    assert "exercise mode: your code in place of course.s03_paged.block_manager.hash_block" in out
    assert "NotImplementedError: exercise:" in out
    for test in ["test_greedy_keeps_the_matching_prefix_then_the_targets_token",
                 "test_residual_is_where_the_target_wants_more",
                 "test_block_manager_prefix_hits_reuse_full_blocks_only"]:
        assert any(line.startswith("FAILED") and f"::{test}" in line for line in out.splitlines()), out[-3000:]
