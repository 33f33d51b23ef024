"""Results stored by an earlier identical call: found again instead of recomputed.

A verb that writes a result file (``out``) records its *request* in the file: the verb, every
option that fixes its numbers, the SHA-256 of its input files, and the toolkit version and
code digest.  Calling the verb again with the same request returns the stored result; any
other request (changed options, edited inputs, other code) recomputes and replaces it.  Every
input is validated before the stored result is looked up.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from ..model.validation import OutputError, ValidationError
from .results import read_json, restore_non_finite, stamps, to_jsonable, write_json

R = TypeVar("R")

OUT_RULE = ("a name ending in .json is the result file itself (other outputs go beside it, "
            "named after it); any other name is a folder, created if needed")


@overload
def out_json(out: str | os.PathLike, name: str) -> Path: ...
@overload
def out_json(out: None, name: str) -> None: ...
@overload
def out_json(out: str | os.PathLike | None, name: str) -> Path | None: ...


def out_json(out: str | os.PathLike | None, name: str) -> Path | None:
    """The JSON result file that ``out`` names (see :data:`OUT_RULE`): ``out`` itself when it
    ends in .json or already exists and is not a folder (``/dev/null``), else ``out/<name>``.

    None stays None; an empty name is an output error.

    >>> out_json("runs", "ode.json").as_posix()
    'runs/ode.json'
    """
    if out is None:
        return None
    if not str(out).strip():
        raise OutputError("out: must be a .json file or a folder name (got an empty or blank "
                          "path)")
    path = Path(out)
    if path.suffix.lower() == ".json" or (path.exists() and not path.is_dir()):
        if path.is_dir():   # refused now, not after the run it would have kept
            raise OutputError(f"out: {path} is a directory, not a file")
        return path
    return path / name


def beside(json_path: Path, suffix: str) -> Path:
    """A companion output of a result file: ``x.json`` → ``x<suffix>`` (e.g. ``.png``)."""
    return json_path.with_name(json_path.stem + suffix)


def file_digest(path: str | os.PathLike | None) -> str | None:
    """SHA-256 of an input file's bytes, or of a folder's files (their names and digests, so
    an edited, added or removed file recomputes); None when it is neither a readable regular
    file nor a folder: the loader then reports the problem."""
    if path is not None and Path(path).is_dir():
        return folder_digest(Path(path))
    try:
        if path is None or not Path(path).is_file():
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return None


def folder_digest(folder: Path) -> str | None:
    """SHA-256 over the sorted names and contents of the regular files directly in
    ``folder`` (None when it cannot be listed)."""
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return None
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.name}\0{file_digest(p)}\n".encode())
    return digest.hexdigest()


def plain(value: Any) -> Any:
    """An option value as JSON data: activations by their parameters, option objects as
    dicts, arrays as lists."""
    if hasattr(value, "params") and callable(value.params):
        return value.params()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def request_of(verb: str, options: dict, files: tuple[str, ...] = ()) -> dict:
    """What fixes the numbers of a call: its verb, ``options`` (without those that only
    change how it runs), the SHA-256 of the input files named by ``files`` (an edited input
    recomputes), and the toolkit's version and code digest (a result of other code is not
    reused)."""
    kept = {k: plain(v) for k, v in sorted(options.items())}
    digests = {name: file_digest(options.get(name)) for name in files}
    return to_jsonable({"verb": verb, "options": kept, "input_sha256": digests, **stamps()})


def stored_output(path: Path | None, request: dict) -> dict | None:
    """The result stored at ``path`` when it was written by this same request, else None;
    without its ``request``, and with the values written as null because they were NaN or
    inf restored.  A file that is not a readable result is left alone (a new run replaces
    it)."""
    if path is None or not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValidationError:
        return None
    if data.get("request") != to_jsonable(request):
        return None
    return restore_non_finite({k: v for k, v in data.items() if k != "request"})


def stamp_output(path: Path | None, request: dict) -> None:
    """Add ``request`` to a result file another module wrote, so that the same call finds it
    again (:func:`stored_output`)."""
    if path is None or not path.is_file():
        return  # /dev/null and the like: nothing to find again
    write_json(path, {**read_json(path), "request": request})


def reused(result: R) -> R:
    """Mark a result that was found stored instead of computed (the CLI then says "kept")."""
    object.__setattr__(result, "reused", True)
    return result
