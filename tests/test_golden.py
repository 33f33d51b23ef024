"""A restructure moves no number: the fixed commands of tests/golden/cases.py, rerun through the
command line and through the Python API, give their recorded outputs bit for bit (except the
fields that name the code, the clock or a path: golden_io.UNSTABLE)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import CASES  # noqa: E402
from golden_io import argv_of, run_cli, stable  # noqa: E402


def recorded(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_command_line_gives_the_recorded_output(name, tmp_path):
    verb, kwargs = CASES[name]
    got = run_cli(argv_of(verb, kwargs, GOLDEN), tmp_path)
    assert stable(got) == stable(recorded(name)["output"])
