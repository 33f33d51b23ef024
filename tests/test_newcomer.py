"""Smaller things a newcomer met (issue 42 §5): a figure run on their own images says it is
the full figure, and the README's notebook command is provided by the extra it names."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import theory_kit as tk

ROOT = Path(__file__).resolve().parent.parent


class Started(Exception):
    """The figure's computation started (raised in its place)."""


@pytest.mark.parametrize("quick", [False, True])
def test_a_figure_on_your_images_says_it_is_the_full_run(quick, tmp_path, monkeypatch):
    """``figure 5 --data FILE`` ran the full figure (about 5 min) with only the generic
    estimate line; a user trying their file first meant the quick one."""
    path = tmp_path / "digits.npz"
    rng = np.random.default_rng(0)
    np.savez(path, images=rng.random((40, 8, 8)), labels=np.arange(40) % 10)

    def started(*args, **kwargs):
        raise Started
    monkeypatch.setattr("theory_kit.figures.runner.run_figure", started)
    lines: list[str] = []
    with pytest.raises(Started):
        tk.figure(5, quick=quick, data=path, out=tmp_path / "figs",
                  run=tk.Run(progress=False, jobs=1), log=lines.append)
    said = [line for line in lines if "your images" in line]
    if quick:
        assert said == []
    else:
        assert len(said) == 1 and re.fullmatch(
            r"figure 5: the full figure on your images \(.*digits\.npz\), about [\d.]+ min on "
            r"the reference machine; add --quick for the reduced run \(about \d+ s\)", said[0])


def test_the_readme_runs_a_notebook_with_what_its_extra_installs():
    """The README's notebook command must work after installing the extra it names: nbconvert
    was suggested but in no extra; ``jupyter execute`` is nbclient's, now in ``[notebook]``
    with the kernel (ipykernel); CI runs the command as written."""
    tomllib = pytest.importorskip("tomllib")     # (Python >= 3.11)
    readme = (ROOT / "README.md").read_text()
    assert "nbconvert" not in readme
    line = next(line for line in readme.splitlines()
                if "jupyter execute" in line and "pip install" in line)
    extra = re.search(r"pip install -e '\.\[(\w+)\]'", line)[1]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = pyproject["project"]["optional-dependencies"][extra]
    assert {"nbclient", "ipykernel"} <= {re.split(r"[<>=\[ ;]", dep)[0] for dep in wanted}
    assert (ROOT / re.search(r"jupyter execute (\S+)", line)[1]).is_file()
    assert line.strip() in (ROOT / ".ci" / "run").read_text()
