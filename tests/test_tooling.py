"""The package stays linted and typed: ruff and mypy run clean, and mypy catches a misspelt
keyword in a call of the typed API (examples/typed_api.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "typed_api.py"

pytestmark = pytest.mark.xdist_group("mypy")   # one worker: the two mypy runs share a cache


def run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


# the README's lint command (.ci/run runs it) checks the same in the default CI job
@pytest.mark.slow
def test_ruff_is_clean():
    pytest.importorskip("ruff")
    done = run(["ruff", "check", "--no-cache", "theory_kit", "examples/typed_api.py"])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_is_clean(mypy_cache):
    pytest.importorskip("mypy")
    done = run(["mypy", "--cache-dir", str(mypy_cache)])   # files from pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow   # a cold mypy run (~20 CPU s); .ci/run's lint command runs mypy itself
def test_mypy_fails_a_misspelt_keyword(mypy_cache, tmp_path):
    pytest.importorskip("mypy")
    text = EXAMPLE.read_text()
    assert 'method="quad", run=' in text
    bad = tmp_path / "typo.py"
    bad.write_text(text.replace('method="quad", run=', 'methd="quad", run='))
    done = run(["mypy", "--cache-dir", str(mypy_cache), "--config-file",
                str(ROOT / "pyproject.toml"), str(bad)], cwd=ROOT)
    assert done.returncode == 1
    assert 'Unexpected keyword argument "methd" for "error"' in done.stdout


def test_the_typed_example_runs():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("E = 0.4922565808 ")
