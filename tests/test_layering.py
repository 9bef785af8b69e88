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
