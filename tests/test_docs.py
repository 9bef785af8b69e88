"""The course's own documents stay true to the code: the README's course map lists what each
stage really imports, and docs/ name only files, classes, methods and functions that exist.
Rename something and these tests tell you which page to update."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STAGE_IMPORT = re.compile(r"^course\.(s(\d\d)_\w+|final)\b")


def sources(folder: Path):
    """The lesson's code: modules and notebook code cells, not its tests."""
    for path in sorted(folder.rglob("*.py")):
        if "tests" not in path.relative_to(folder).parts:
            yield path.read_text()
    for path in sorted(folder.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def stages_imported(folder: Path) -> set[str]:
    found = set()
    for source in sources(folder):
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found |= {m.group(2) or "final" for n in names if (m := STAGE_IMPORT.match(n))}
    return found


def course_map_rows() -> list[tuple[str, str, str, str]]:
    """README rows `| `NN_name` or `final/` | imports | notes | notebook run |`."""
    section = (ROOT / "README.md").read_text().split("## Course map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\d\d_\w+|final/)` \|([^|]*)\|([^|]*)\|([^|]*)\|$", section, re.M)


def course_map() -> dict[str, tuple[set[str], str]]:
    """-> {stage: (stage numbers it imports, notes)}."""
    return {name: (set(re.findall(r"\b\d\d\b", imports)), notes.strip()) for name, imports, notes, _ in course_map_rows()}


def test_the_course_map_has_a_row_for_every_stage():
    stages = {p.name for p in (ROOT / "stages").iterdir() if re.match(r"\d\d_", p.name) and p.is_dir()}
    assert stages | {"final/"} <= set(course_map())


@pytest.mark.parametrize("name", sorted(course_map()))
def test_the_course_map_lists_what_each_stage_imports(name):
    listed, notes = course_map()[name]
    if notes.startswith("being built"):
        pytest.skip(f"{name} is being built; its row is checked once it lands")
    folder = ROOT / ("final" if name == "final/" else f"stages/{name}")
    own = "final" if name == "final/" else name[:2]
    assert stages_imported(folder) - {own} == listed, f"update {name}'s row of the course map in README.md"


# ---- names in the docs ----------------------------------------------------------------------
def code_facts():
    """Every class (its bases and the names its body defines, self.x included) and every other
    name a def, assignment, field or argument defines, in stages/ and final/."""
    classes: dict[str, tuple[set[str], set[str]]] = {}
    names: set[str] = set()
    for path in [*ROOT.glob("stages/*/**/*.py"), *ROOT.glob("final/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, (ast.Name, ast.Attribute))}
                members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
                members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
                members |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                            and isinstance(n.value, ast.Name) and n.value.id == "self" and isinstance(n.ctx, ast.Store)}
                old_bases, old_members = classes.get(node.name, (set(), set()))
                classes[node.name] = (old_bases | bases, old_members | members)
                names.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
                names |= {a.arg for a in node.args.args + node.args.kwonlyargs}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return classes, names


def has_member(classes, cls: str, member: str, seen=()) -> bool:
    if cls not in classes or cls in seen:
        return False
    bases, members = classes[cls]
    return member in members or any(has_member(classes, b, member, (*seen, cls)) for b in bases)


def backticked(path: Path) -> list[str]:
    return [re.sub(r"\(.*\)$", "", m) for m in re.findall(r"`([^`\n]+)`", path.read_text())]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_files_that_exist(doc):
    files = {p.name for p in ROOT.glob("stages/*/**/*") if p.is_file()} | {p.name for p in ROOT.glob("final/**/*")} \
        | {p.name for p in ROOT.glob("tests/*")} | {p.name for p in ROOT.glob("docs/*")}
    missing = []
    for text in backticked(doc):
        for token in re.findall(r"[\w./-]+\.(?:py|md|toml|safetensors)\b", text):
            if token.startswith("course.") or re.search(r"NN|MODULE", token):  # a module name; a pattern
                continue
            if "/" in token and not (ROOT / token).exists() and not any(ROOT.glob(f"stages/*/{token}")):
                missing.append(token)
            elif "/" not in token and token not in files and not (ROOT / token).exists():
                missing.append(token)
    assert not missing, f"{doc.name} names files that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_classes_and_methods_that_exist(doc):
    classes, names = code_facts()
    missing = []
    for text in backticked(doc):
        if re.fullmatch(r"[A-Z]\w*\.\w+", text) and text.rsplit(".", 1)[1] not in FILE_TYPES:  # Class.member
            cls, member = text.split(".")
            if cls in classes and not has_member(classes, cls, member):
                missing.append(text)
            elif cls not in classes and cls not in EXTERNAL_CLASSES:
                missing.append(text)
        elif doc.name == "request_trace.md" and re.fullmatch(r"_?[a-z][a-z0-9]*_[a-z0-9_]*", text):
            if text not in names and text not in EXTERNAL_NAMES:  # a function, field or variable of ours
                missing.append(text)
    assert not missing, f"{doc.name} names what the code does not define: {sorted(set(missing))}"


FILE_TYPES = {"md", "py", "toml", "json", "ipynb", "safetensors"}
EXTERNAL_CLASSES: set[str] = set()  # classes of other projects a page may name as Class.member
EXTERNAL_NAMES = {"call_soon_threadsafe"}  # asyncio's, named in the request trace


@pytest.mark.parametrize("name, time", [(name, time) for name, _, _, time in course_map_rows()], ids=lambda x: x)
def test_the_course_map_quotes_each_notebooks_saved_run(name, time):
    """The map's "notebook run" column is the time and mode written at the top of the notebook
    when its outputs were saved (tests/stamp_notebooks.py), so a learner knows what Run All costs."""
    folder = ROOT / ("final" if name == "final/" else f"stages/{name}")
    saved = []
    for path in sorted(folder.glob("*.ipynb")):
        top = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown").source
        found = re.search(r"Saved outputs: (quick|full) mode.*? in (\d+) s", top)
        assert found, f"{path.name} has no saved-run note at its top"
        saved.append(f"{found.group(2)} s ({found.group(1)})")
    assert time.strip() == ", ".join(saved), f"update {name}'s notebook run in README.md's course map"


# ---- headline figures ------------------------------------------------------------------------
# Each README's "## Measured" section opens with one headline table:
#
#     | figure | value | results |
#     |---|---:|---|
#     | single stream, this engine | 48.8 tok/s | `results/bench_peers.json` `single.ours.tok_s` |
#
# The results cell names a JSON file (relative to the README's folder) and the key path of the
# value in it: dict keys joined by dots, and a row of a list picked by its name in brackets,
# `rows[chat/eagle/k=1].speedup` (the row whose "name" is "chat/eagle/k=1"), never by its
# position, so a rerun that adds a row cannot point a figure at another one. The value shown
# must be what the file holds, rounded as written (a `%` value may be stored as a fraction), and
# the JSON must say which command wrote it, a command the README quotes too. So a figure cannot
# drift from the run that made it.
README_WITH_FIGURES = sorted(ROOT.glob("stages/*/README.md")) + [ROOT / "final" / "README.md"]
FIGURE_ROW = re.compile(r"^\|(?P<what>[^|]+)\|(?P<value>[^|]+)\|\s*`(?P<file>[^`]+\.json)`\s*`(?P<key>[^`]+)`\s*\|\s*$",
                        re.M)


def headline_table(readme: Path) -> tuple[list[re.Match], str]:
    text = readme.read_text()
    measured = re.split(r"^## Measured.*$", text, maxsplit=1, flags=re.M)
    assert len(measured) == 2, f"{readme.relative_to(ROOT)} has no '## Measured' section"
    body = measured[1].split("\n## ", 1)[0]
    table = re.search(r"^\| *figure *\| *value *\| *results *\|\n\|[-:| ]+\|\n((?:\|.*\|\n?)+)", body, re.M)
    assert table, f"{readme.relative_to(ROOT)}: '## Measured' has no `| figure | value | results |` table"
    return list(FIGURE_ROW.finditer(table.group(1))), body


KEY_PART = re.compile(r"\[(?P<name>[^\]]+)\]|(?P<key>[^.\[\]]+)")


def lookup(data, key: str):
    """The value at `key` in `data`: `a.b` walks dict keys, `rows[NAME]` picks the one row of the
    list `rows` whose "name" is NAME. A list indexed by position is refused."""
    for part in KEY_PART.finditer(key):
        if part["name"] is not None:
            assert isinstance(data, list), f"[{part['name']}] names a row, but this is not a list of rows"
            found = [row for row in data if isinstance(row, dict) and row.get("name") == part["name"]]
            assert len(found) == 1, f"{len(found)} rows are named {part['name']!r} (names: " \
                                    f"{[row.get('name') for row in data if isinstance(row, dict)][:12]})"
            data = found[0]
        else:
            assert not isinstance(data, list), \
                f"{key}: a list's row is picked by its name in brackets (rows[NAME]), never by position ({part['key']})"
            data = data[part["key"]]
    return data


def test_figure_keys_name_rows_and_refuse_positions():
    data = {"rows": [{"name": "chat/k=1", "x": 1.5}, {"name": "code/k=1", "x": 2.5}], "batches": {"8": {"s": 3}}}
    assert lookup(data, "rows[code/k=1].x") == 2.5
    assert lookup(data, "batches.8.s") == 3  # a dict key that happens to be a number is a name
    with pytest.raises(AssertionError, match="by its name"):
        lookup(data, "rows.1.x")
    with pytest.raises(AssertionError, match="0 rows are named"):
        lookup(data, "rows[chat/k=2].x")


def shown_equals(shown: str, stored) -> bool:
    number = re.search(r"-?\d[\d,]*(?:\.\d+)?", shown)
    assert number, f"no number in {shown!r}"
    text = number.group(0).replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    candidates = [float(stored)] + ([float(stored) * 100] if "%" in shown else [])
    return any(abs(round(c, decimals) - float(text)) < 10 ** -decimals / 2 + 1e-9 for c in candidates)


@pytest.mark.parametrize("readme", README_WITH_FIGURES, ids=lambda p: p.parent.name)
def test_headline_figures_equal_their_results_files(readme):
    rows, body = headline_table(readme)
    assert rows, f"{readme.relative_to(ROOT)}: the headline table has no row naming a results file and key"
    for row in rows:
        path = readme.parent / row["file"]
        assert path.is_file(), f"{readme.relative_to(ROOT)}: {row['file']} is not there"
        data = json.loads(path.read_text())
        command = data.get("command") if isinstance(data, dict) else None
        assert command, f"{path.relative_to(ROOT)} does not say which command wrote it (write it with measure.write_json)"
        assert command.split(" --")[0] in body, f"{readme.relative_to(ROOT)}: quote the command `{command}` beside its figures"
        stored = lookup(data, row["key"].strip())
        assert shown_equals(row["value"], stored), \
            f"{readme.relative_to(ROOT)}: '{row['what'].strip()}' shows {row['value'].strip()}, {row['file']} holds {stored}"


# ---- words for the reader --------------------------------------------------------------------
# The repo speaks to a learner and an operator about the engine, never about how the repo was
# made: no issue numbers, work sessions, work in progress or run diaries (git keeps the history).
MAKING_OF = re.compile(r"\bissues? #?\d+\b|\bsessions?\b|work in progress|\b(?:earlier|previous|next) (?:run|session)s?\b"
                       r"|\bbefore this change\b", re.I)
ALLOWED = re.compile(r"scope=.session|httpx|Session\(|sessionmaker|session_id|requests\.Session|aiohttp", re.I)


def written_files():
    for pattern in ("*.md", "*.py", "*.c", "*.ipynb", "*.sh", "*.toml"):
        for path in ROOT.rglob(pattern):
            rel = path.relative_to(ROOT)
            if rel.parts[0] not in (".git", ".ci") and "node_modules" not in rel.parts \
                    and not any(p.startswith(".") or p.endswith(".egg-info") for p in rel.parts):
                yield path


def test_the_repo_speaks_to_its_reader():
    found = []
    for path in written_files():
        if path == Path(__file__).resolve():  # this file has to name the words it looks for
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".ipynb":  # the cells, not the saved outputs' metadata
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        for number, line in enumerate(text.splitlines(), 1):
            if MAKING_OF.search(line) and not ALLOWED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "lines that speak of how the repo was made, not to its reader:\n" + "\n".join(found[:60])
