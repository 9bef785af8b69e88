"""Fixtures shared by every stage's tests (pytest loads this root conftest for any path), the
`gpu` marker's skip, and the exercise switch (`--exercise`)."""
import importlib
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer, save_hf_folder, tiny_model


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny(request):
    """Each tiny random-weight config in turn: (name, model)."""
    return request.param, tiny_model(request.param, seed=0)


@pytest.fixture(scope="session")
def byte_tok():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, byte_tok):
    """A tiny model saved as a Hugging Face folder, for tests that load by path (CLIs, servers)."""
    path = tmp_path_factory.mktemp("tiny")
    save_hf_folder(tiny_model("gqa_tied", seed=0), byte_tok, path)
    return path


def fair_threads() -> int:
    """torch threads for this test process: every core, or its share when pytest-xdist runs
    several workers (PYTEST_XDIST_WORKER_COUNT), so workers never wait on each other's threads."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


@pytest.fixture(scope="session")
def smollm2():
    """The real default model (SmolLM2-135M-Instruct), fetched and converted on first use."""
    from course.s01_decode_loop.weights import load_model

    torch.set_num_threads(fair_threads())
    return load_model()


@pytest.fixture(autouse=True)
def _leaves_grad_mode_as_found():
    """A test that switches autograd off for the whole process (torch.set_grad_enabled(False) in
    a main() it calls) would break every later test on its worker that trains: fail it instead."""
    before = torch.is_grad_enabled()
    yield
    if torch.is_grad_enabled() != before:
        torch.set_grad_enabled(before)
        pytest.fail(f"the test left autograd {'on' if not before else 'off'} for the whole process; "
                    "use `with torch.no_grad():` or @torch.no_grad() instead")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where there is no CUDA device; their CPU twins still run."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a folder named gpu
            item.add_marker(skip)


# ---- the exercise switch ---------------------------------------------------------------------
# `pytest stages/03_paged --exercise` runs the stage's tests against the learner's code in
# stages/NN_name/exercises/MODULE.py instead of the reference in stages/NN_name/MODULE.py. Each
# function an exercise file defines takes the place of the reference function of that name (every
# module that imported it sees the new one); each function of a class it defines becomes a method
# of the reference class of that name. They run in the reference module's namespace, so they see
# exactly the names the reference code sees. Without the flag nothing changes.
ROOT = Path(__file__).resolve().parent


def exercise_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.glob("stages/*/exercises/*.py") if not p.name.startswith("_"))


def reference_module(path: Path) -> types.ModuleType:
    """stages/03_paged/exercises/block_manager.py -> course.s03_paged.block_manager"""
    return importlib.import_module(f"course.s{path.parent.parent.name}.{path.stem}")


def load_exercise(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"course_exercise_{path.parent.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_namespace(fn: types.FunctionType, module: types.ModuleType) -> types.FunctionType:
    """`fn`'s code with `module`'s globals, as if it had been written in the reference file."""
    new = types.FunctionType(fn.__code__, module.__dict__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__doc__, new.__qualname__ = fn.__kwdefaults__, fn.__doc__, fn.__qualname__
    new.__annotations__, new.__module__ = fn.__annotations__, module.__name__
    return new


def install_exercise(path: Path) -> list[str]:
    """Put the exercise file's functions in place of the reference; returns what was replaced."""
    target, stubs, replaced = reference_module(path), load_exercise(path), []
    for name, obj in vars(stubs).items():
        if getattr(obj, "__module__", None) != stubs.__name__:
            continue  # imported into the exercise file, not written there
        if inspect.isfunction(obj):
            old, new = getattr(target, name, None), _in_namespace(obj, target)
            for module in list(sys.modules.values()):  # `from x import f` bound f elsewhere: rebind it too
                if getattr(module, "__name__", "").startswith("course.") and old is not None \
                        and getattr(module, name, None) is old:
                    setattr(module, name, new)
            setattr(target, name, new)
            replaced.append(f"{target.__name__}.{name}")
        elif inspect.isclass(obj):
            cls = getattr(target, name)
            for attr, fn in vars(obj).items():
                if inspect.isfunction(fn):
                    setattr(cls, attr, _in_namespace(fn, target))
                    replaced.append(f"{target.__name__}.{name}.{attr}")
    return replaced


def pytest_addoption(parser):
    parser.addoption("--exercise", action="store_true", default=False,
                     help="run the tests against your code in stages/*/exercises/ instead of the reference")


def stages_named(args: list[str], root: Path = ROOT) -> set[str] | None:
    """The stage folders the command line points into (`pytest stages/03_paged` -> {"03_paged"});
    None when it points at no stage (a bare `pytest`): then every stage's exercises apply."""
    stages, names = (root / "stages").resolve(), set()
    for arg in args:
        path = Path(arg.split("::")[0]).resolve()
        if path.is_relative_to(stages) and path != stages:
            names.add(path.relative_to(stages).parts[0])
    return names or None


def pytest_configure(config):
    # One worker per core: each worker's ops on its own share of the cores. Two processes whose
    # OpenMP threads spin against each other on two cores run a tiny model's step ~7x slower
    # (measured), so the servers, CLIs and notebook kernels a test starts get the same share.
    torch.set_num_threads(fair_threads())
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(fair_threads()))
    if config.getoption("--exercise", default=False):
        # Only the stages under test: a learner on stage 03 still runs stage 01's reference
        # attention underneath, whatever stage 01's exercise files hold.
        wanted = stages_named(config.args)
        config._exercises = [name for path in exercise_files()
                             if wanted is None or path.parent.parent.name in wanted
                             for name in install_exercise(path)]


def pytest_report_header(config):
    if getattr(config, "_exercises", None):
        return "exercise mode: your code in place of " + ", ".join(config._exercises)
