"""Record the golden outputs of tests/golden/cases.py with the code as it stands.

    python tests/golden/record.py [NAME ...]

Each case is run through the command line in this process; its output (the JSON it prints or
writes, or the text of ``derive``) is stored as ``tests/golden/<name>.json`` together with the
argument list.  Only for a change that is meant to move numbers; a restructure must not.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import CASES  # noqa: E402

from golden_io import argv_of, run_cli  # noqa: E402


def compare_log() -> Path:
    """The training log of the ``compare`` case: one reduced SGD run (made once, committed)."""
    path = HERE / "compare_log.json"
    if not path.exists():
        from theory_kit.cli import main
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sim.json"
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["simulate", "--activation", "softmax", "--H", "2", "--L", "3",
                             "--nu", "2,2", "--gamma", "1", "--D", "400", "--runs", "1",
                             "--seed", "5", "--T", "2", "--times", "0,0.5,1,1.5,2",
                             "--no-progress", "--out", str(out)]) == 0
            sim = json.loads(out.read_text())
        log = {"t": sim["t"], "M": sim["M"][0], "Q": sim["Q"][0], "D": 400, "gamma": 1.0}
        path.write_text(json.dumps(log))
    return path


def main(names: list[str]) -> None:
    compare_log()
    for name, (verb, kwargs) in CASES.items():
        if names and name not in names:
            continue
        argv = argv_of(verb, kwargs, HERE)
        with tempfile.TemporaryDirectory() as tmp:
            output = run_cli(argv, Path(tmp))
        (HERE / f"{name}.json").write_text(json.dumps({"verb": verb, "kwargs": kwargs, "output": output},
                                                      indent=1, sort_keys=True) + "\n")
        print(f"recorded {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
