"""Running a golden case through the command line, and comparing outputs bit for bit."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

# verb -> (how its output is read, the file it writes under --out)
OUTPUTS = {"error": ("stdout-json", None), "bayes-error": ("stdout-json", None),
           "drift": ("stdout-json", None), "einf": ("stdout-json", None),
           "escape": ("stdout-json", None), "derive": ("stdout-text", None),
           "ode": ("file", "ode.json"), "simulate": ("file", "simulate.json"),
           "compare": ("file", "compare.json"), "figure": ("file", "fig{number}{quick}.json")}
COMMA = {"nu", "times"}
# fields that name the code, the clock or the machine, never a number of the maths
UNSTABLE = frozenset({"version", "code_digest", "seconds", "timing", "request", "path", "files"})


def _text(name: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        if name in COMMA or name == "D":
            return ",".join(str(x) for x in value)
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def argv_of(verb: str, kwargs: dict, folder: Path) -> list[str]:
    """The command line of a case (``@name`` values are files beside the cases)."""
    argv = [verb]
    for name, value in kwargs.items():
        if name == "number":
            argv.append(str(value))
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
            continue
        if isinstance(value, str) and value.startswith("@"):
            value = str(folder / value[1:])
        argv += [flag, _text(name, value)]
    mode, _ = OUTPUTS[verb]
    if mode == "stdout-json":
        argv.append("--json")
    return argv


def run_cli(argv: list[str], tmp: Path) -> Any:
    """Run ``theory-kit argv`` in this process (outputs under ``tmp``); its output."""
    from theory_kit.cli import main
    verb = argv[0]
    mode, name = OUTPUTS[verb]
    full = list(argv)
    if mode == "file":
        full += ["--out", str(tmp)]
        if verb != "figure":
            full.append("--no-progress")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(full)
    if status != 0:
        raise AssertionError(f"theory-kit {' '.join(full)} exited {status}")
    if mode == "stdout-text":
        return buf.getvalue()
    if mode == "stdout-json":
        return json.loads(buf.getvalue())
    number = argv[1] if verb == "figure" else ""
    quick = "_quick" if verb == "figure" and "--quick" in argv else ""   # figN_quick.json
    return json.loads((tmp / name.format(number=number, quick=quick)).read_text())


def stable(value: Any) -> Any:
    """``value`` without the fields that name the code, the clock or a path."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in UNSTABLE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value
