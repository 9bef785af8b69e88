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


def test_the_core_stages_have_exercises():
    assert {p.parent.parent.name for p in EXERCISES} >= {"01_decode_loop", "02_kv_cache", "03_paged",
                                                         "04_continuous_batching", "05_speculative",
                                                         "06_kernels_graphs", "07_disaggregated",
                                                         "08_structured"}


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


def run_with_the_switch(*tests: str, only: list[str] = ()) -> str:
    """Run the stage's tests with its stubs in place; `only`: just these tests (the ones that must fail)."""
    select = ["-k", " or ".join(only)] if only else []
    run = subprocess.run([sys.executable, "-m", "pytest", *tests, *select, "--exercise", "-p", "no:cacheprovider",
                          "--tb=line", "-rf", "-n", "0"],  # in this process: the outer run is already parallel
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]  # 1: tests failed (not a crash, not a usage error)
    assert "NotImplementedError: exercise:" in out
    return out


# (the stage's test files, a stub the run must name, tests that must fail with the stubs in place)
STAGE_RUNS = {
    "01": (["stages/01_decode_loop/tests/test_attention.py", "stages/01_decode_loop/tests/test_sampling.py"],
           "course.s01_decode_loop.attention.causal_attention",
           ["test_attention_causal_matches_sdpa", "test_top_k_matches_reference"]),
    "02": (["stages/02_kv_cache/tests/test_kv_cache.py"], "course.s02_kv_cache.kv_cache.KVCache.write",
           ["test_cached_greedy_equals_naive", "test_cache_never_writes_past_its_capacity"]),
    "03+05": (["stages/03_paged/tests/test_block_manager.py", "stages/05_speculative/tests/test_verify.py"],
              "course.s03_paged.block_manager.hash_block",
              ["test_greedy_keeps_the_matching_prefix_then_the_targets_token",
               "test_residual_is_where_the_target_wants_more",
               "test_block_manager_prefix_hits_reuse_full_blocks_only"]),
    "04": (["stages/04_continuous_batching/tests/test_engine.py"],
           "course.s04_continuous_batching.scheduler.Scheduler._make_room",
           ["test_batching_token_budget_and_chunked_prefill_schedule",
            "test_batching_preemption_keeps_outputs_identical"]),
    "06": (["stages/06_kernels_graphs/tests/test_torch_backend.py"],
           "course.s06_kernels_graphs.torch_backend.decode_attention_gather",
           ["test_captured_and_eager_steps_equal_stage03_and_the_oracle"]),
    "07": (["stages/07_disaggregated/tests/test_router.py"], "course.s07_disaggregated.router.PrefixTree.insert",
           ["test_same_prompt_and_its_extensions_land_on_the_same_replica",
            "test_lru_evicts_the_end_of_a_prefix_before_its_beginning"]),
    "08": (["stages/08_structured/tests/test_matcher.py"], "course.s08_structured.pda.PDA.advance",
           ["test_masks_equal_the_naive_reference_at_every_step", "test_a_rejected_token_leaves_the_state_unchanged"]),
}


@pytest.mark.parametrize("stage", sorted(STAGE_RUNS))
def test_with_the_switch_the_stages_tests_run_the_stubs_and_fail(stage):
    tests, stub, failing = STAGE_RUNS[stage]
    out = run_with_the_switch(*tests, only=failing)
    assert "exercise mode: your code in place of" in out and stub in out
    for test in failing:
        assert any(line.startswith("FAILED") and f"::{test}" in line for line in out.splitlines()), out[-3000:]


def test_the_switch_replaces_only_the_stages_under_test():
    """A learner on stage 04 runs stage 01's reference attention underneath, whatever stage 01's
    exercise files hold: only the exercises of the stages named on the command line apply."""
    out = run_with_the_switch("stages/04_continuous_batching/tests/test_engine.py",
                              only=["test_batching_preemption_keeps_outputs_identical"])
    header = next(line for line in out.splitlines() if line.startswith("exercise mode:"))
    assert "course.s04_continuous_batching" in header and "course.s01_decode_loop" not in header
    assert switch.stages_named(["stages/03_paged/tests/test_block_manager.py::test_x", "final"]) == {"03_paged"}
    assert switch.stages_named(["final", "tests"]) is None
