"""Every stage notebook runs top to bottom, headless, in quick mode (COURSE_QUICK=1)."""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "stages").glob("*/*.ipynb")) + sorted((ROOT / "final").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")  # fewer tokens, smaller sweeps; the kernel inherits it
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
