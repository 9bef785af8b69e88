"""Every stage README has the same shape, so you know where to look in each one:

    # Stage NN — the lesson
    ## What changed since stage MM      (stage 01: ## Where this starts)
    ## Read in this order
    ## Measured ...                      the numbers, and the command that made them
    ## What the tests prove              bullets, each naming a test: `pytest stages/NN_name -k EXPR`
    ## Left out

Other sections may sit between these. The checks: the headings are there, in this order; every
`-k EXPR` still selects a test of that stage; every `.json` file named in backticks exists.
Rename a test or move a results file, and this says which README to update."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted(ROOT.glob("stages/*/README.md"))
RUN_ONE = re.compile(r"`pytest (stages/\S+) -k (\w+)`")


def read(readme: Path) -> str:
    """The README, with `#` lines inside fenced code blocks indented: a comment is not a heading."""
    return re.sub(r"^```.*?^```", lambda m: m.group(0).replace("\n#", "\n #"), readme.read_text(),
                  flags=re.S | re.M)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for every `## ` heading, in order."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def defined_tests(stage: Path) -> set[str]:
    """Test functions (parametrized ones too) and test classes defined under the stage's tests/ folders."""
    names = set()
    for path in stage.rglob("tests/**/*.py"):  # the lesson's tests and each sub-package's
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                names.add(node.name)
            elif isinstance(node, ast.Assign):  # TestMachine = StateMachine.TestCase (hypothesis)
                names |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("Test")}
    return names


@pytest.mark.parametrize("readme", READMES, ids=[r.parent.name for r in READMES])
def test_stage_readme_has_the_shape(readme):
    stage = readme.parent
    number = stage.name[:2]
    text = read(readme)
    assert text.startswith(f"# Stage {number} — "), "the first line is the title: # Stage NN — ..."

    headings = [h for h, _ in sections(text)]
    start = "## Where this starts" if number == "01" else "## What changed since stage"
    wanted = [start, "## Read in this order", "## Measured", "## What the tests prove", "## Left out"]
    found = [next((i for i, h in enumerate(headings) if h.startswith(w)), None) for w in wanted]
    missing = [w for w, i in zip(wanted, found) if i is None]
    assert not missing, f"{readme.relative_to(ROOT)} has no heading starting with {missing}"
    assert found == sorted(found), f"{readme.relative_to(ROOT)}: the headings must come in the order {wanted}"

    for heading, body in sections(text):
        if heading.startswith("## What changed since stage"):
            assert int(heading.split()[-1]) < int(number), f"{heading}: a stage builds on an earlier one"
        if heading.startswith("## Measured"):
            assert "python -m" in body or ".ipynb" in body, f"{heading}: name the command that made the numbers"


@pytest.mark.parametrize("readme", READMES, ids=[r.parent.name for r in READMES])
def test_each_proof_names_a_test_that_exists(readme):
    stage = readme.parent
    body = "".join(b for h, b in sections(read(readme)) if h.startswith("## What the tests prove"))
    # a bullet is its first line and the indented lines that continue it
    bullets = re.findall(r"^[-*] .*(?:\n[ \t]+\S.*)*", body, flags=re.M)
    assert len(bullets) >= 3, "list what the tests prove, one bullet per claim"
    names = defined_tests(stage)
    for bullet in bullets:
        commands = RUN_ONE.findall(bullet)
        assert commands, f"this bullet names no `pytest {stage.relative_to(ROOT)} -k TEST`:\n{bullet}"
        for path, expr in commands:
            assert path == f"stages/{stage.name}", f"`pytest {path} -k {expr}` runs another stage's tests"
            assert any(expr in name for name in names), f"-k {expr} selects no test in {stage.name}/tests"


@pytest.mark.parametrize("readme", READMES, ids=[r.parent.name for r in READMES])
def test_results_files_named_in_backticks_exist(readme):
    stage = readme.parent
    for name in re.findall(r"`([\w./-]+\.json)`", read(readme)):
        here = (stage / name).is_file() or ("/" in name and (ROOT / name).is_file())
        assert here, f"{readme.relative_to(ROOT)} names `{name}`, which is not there; name the command that writes it"
