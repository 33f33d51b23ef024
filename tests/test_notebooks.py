"""Every notebook runs top to bottom in quick mode (THEORY_KIT_QUICK=1) without errors or warnings."""
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_four_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_quick_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("THEORY_KIT_QUICK", "1")
    monkeypatch.setenv("THEORY_KIT_NO_PROGRESS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    warnings = [o["text"] for o in outputs if o.get("name") == "stderr" and "Warning" in o.get("text", "")]
    assert not warnings, warnings
    assert any(o.get("output_type") == "display_data" for o in outputs)   # a plot was drawn
