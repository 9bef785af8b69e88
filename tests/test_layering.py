"""The one-way layering rule: stage N imports only from stages below it (and itself);
`final/` may import any stage; no stage imports `final`. Checked by reading imports."""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGE_DIR = re.compile(r"^(\d\d)_\w+$")
STAGE_MODULE = re.compile(r"^course\.s(\d\d)_\w+")


def imported_modules(source: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]  # from course import s02_x
    return names


def violations(source: str, stage: int | None) -> list[str]:
    """Imports in `source` that break the rule for code of `stage` (None means final/)."""
    bad = []
    for name in imported_modules(source):
        m = STAGE_MODULE.match(name)
        if stage is not None and name.startswith("course.final"):
            bad.append(name)
        elif m and stage is not None and int(m.group(1)) > stage:
            bad.append(name)
    if "sys.path" in source:
        bad.append("sys.path (import through course.sNN_name instead)")
    return bad


def python_sources(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, path.read_text()
    for path in sorted(folder.rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        # IPython magics and shell escapes are not Python; drop them before parsing
        yield path, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def stage_folders():
    return sorted(p for p in (ROOT / "stages").iterdir() if STAGE_DIR.match(p.name))


def test_layering_checker_catches_upward_imports():
    assert violations("from course.s03_paged.blocks import BlockManager", stage=2) == [
        "course.s03_paged.blocks", "course.s03_paged.blocks.BlockManager"]
    assert violations("from course import s05_speculative", stage=4) == ["course.s05_speculative"]
    assert violations("import course.final.server", stage=7) == ["course.final.server"]
    assert violations("import sys; sys.path.insert(0, '..')", stage=1)
    assert violations("from course.s01_decode_loop.model import CausalLM", stage=2) == []
    assert violations("from course.s07_disaggregated import router", stage=None) == []


@pytest.mark.parametrize("folder", stage_folders() + [p for p in [ROOT / "final"] if p.is_dir()],
                         ids=lambda p: p.name)
def test_layering_stage_imports_only_lower_stages(folder):
    stage = int(STAGE_DIR.match(folder.name).group(1)) if STAGE_DIR.match(folder.name) else None
    problems = {str(p.relative_to(ROOT)): bad for p, src in python_sources(folder) if (bad := violations(src, stage))}
    assert not problems, f"imports that break the one-way layering rule: {problems}"


@pytest.mark.parametrize("folder", stage_folders(), ids=lambda p: p.name)
def test_layering_every_stage_is_a_complete_lesson(folder):
    assert (folder / "README.md").is_file()
    assert len(list(folder.glob("*.ipynb"))) == 1, "one notebook per stage"
    assert list((folder / "tests").glob("test_*.py")), "a stage without tests proves nothing"
    pyproject = (ROOT / "pyproject.toml").read_text()
    name = f"course.s{folder.name}"
    assert f'"{name}" = "stages/{folder.name}"' in pyproject, f"map {folder} to {name} in pyproject.toml"


# ---- the lesson never imports its rooms ------------------------------------------------------
# A stage's top-level files are its lesson; its sub-packages (`cpu/`, `tools/`, `bench/` ...) are
# rooms that go beyond it. A room plugs into a seam the lesson defines (a registry, a hook, an
# option), and `cli.py` / `__main__.py`, the one place that assembles everything, wires it in. So
# no lesson file imports a room, its own stage's or another's, even inside a function: the lesson
# reads whole and runs alone. The few deliberate exceptions are listed with the reason.
NOT_ROOMS = {"tests", "exercises", "results", "examples"}
ASSEMBLERS = {"cli.py", "__main__.py", "conftest.py"}
MOE_FAMILY = ("Mixtral and the Qwen MoE models are families the model serves: one line each in the config, "
              "the layer choice and the checkpoint loader; moe/ holds the rest, so the dense lesson reads alone")
LESSON_IMPORTS_ROOM: dict[tuple[str, str], str] = {
    # (lesson file, room module): why the lesson needs it
    ("stages/01_decode_loop/config.py", "course.s01_decode_loop.moe"): MOE_FAMILY,
    ("stages/01_decode_loop/model.py", "course.s01_decode_loop.moe"): MOE_FAMILY,
    ("stages/01_decode_loop/weights.py", "course.s01_decode_loop.moe"): MOE_FAMILY,
    ("stages/01_decode_loop/weights.py", "course.s01_decode_loop.families"):
        "the loader asks the families room for the model_type a config names (Gemma 3, gpt-oss, Qwen3-Next); "
        "the lesson's model stays the Llama shape",
}


def rooms_of(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and p.name not in NOT_ROOMS and any(p.rglob("*.py"))}


def package_of(folder: Path) -> str:
    return "course.final" if folder.name == "final" else f"course.s{folder.name}"


def room_imports(path: Path, folder: Path) -> set[str]:
    """The rooms (`course.sNN_name.room`) that the lesson file `path` of `folder` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            base = f"{package_of(folder)}.{node.module}" if node.module else package_of(folder)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            m = re.match(r"^course\.(s(\d\d)_\w+|final)\.(\w+)", name)
            if not m:
                continue
            owner = ROOT / "final" if m.group(1) == "final" else ROOT / "stages" / m.group(1)[1:]
            if owner.is_dir() and m.group(3) in rooms_of(owner):
                found.add(f"course.{m.group(1)}.{m.group(3)}")
    return found


def lesson_files(folder: Path):
    return sorted(p for p in folder.glob("*.py") if p.name not in ASSEMBLERS)


def test_room_checker_sees_relative_absolute_and_lazy_imports(tmp_path):
    stage = ROOT / "stages" / "06_kernels_graphs"
    probe = stage / "_probe_room_imports.py"
    try:
        probe.write_text("from .cpu import native\nimport course.s04_continuous_batching.moe.bytes_per_step\n"
                         "def f():\n    from course.s06_kernels_graphs.gpu.decode_attention import x\n"
                         "from .decode_attention import y\n")
        assert room_imports(probe, stage) == {"course.s06_kernels_graphs.cpu", "course.s04_continuous_batching.moe",
                                              "course.s06_kernels_graphs.gpu"}
    finally:
        probe.unlink()


@pytest.mark.parametrize("folder", stage_folders() + [p for p in [ROOT / "final"] if p.is_dir()],
                         ids=lambda p: p.name)
def test_layering_lesson_files_import_no_rooms(folder):
    problems = []
    for path in lesson_files(folder):
        rel = str(path.relative_to(ROOT))
        problems += [f"{rel} imports {room}" for room in sorted(room_imports(path, folder))
                     if (rel, room) not in LESSON_IMPORTS_ROOM]
    assert not problems, ("lesson files that import a room (plug the room into a seam the lesson "
                          "defines, wired by cli.py; or list a deliberate exception with its reason):\n"
                          + "\n".join(problems))


def test_every_listed_exception_is_still_needed():
    stale = [f"{f} -> {room}" for (f, room) in LESSON_IMPORTS_ROOM
             if room not in room_imports(ROOT / f, (ROOT / f).parent)]
    assert not stale, f"exceptions no file needs any more: {stale}"


# a stage's lesson is read in an evening: its top-level files (the assemblers aside) stay within
# a line budget, and its README within a word budget (docs/design.md, "A lesson core, then named rooms")
LESSON_LINES = {"06_kernels_graphs": 1_600}  # denser: every kernel masks windows and reads rotated int8 rows; layer groups
LESSON_LINES_DEFAULT = 2_000
README_WORDS = 3_000


@pytest.mark.parametrize("folder", stage_folders() + [p for p in [ROOT / "final"] if p.is_dir()],
                         ids=lambda p: p.name)
def test_each_lesson_fits_its_budget(folder):
    lines = sum(len(p.read_text().splitlines()) for p in lesson_files(folder))
    budget = LESSON_LINES.get(folder.name, LESSON_LINES_DEFAULT)
    assert lines <= budget, (f"{folder.name}'s top level is {lines} lines (budget {budget}): move what goes "
                             "beyond the lesson into a named room")
    words = len((folder / "README.md").read_text().split())
    assert words <= README_WORDS, f"{folder.name}/README.md is {words} words (budget {README_WORDS})"
