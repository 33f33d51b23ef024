"""Result files: atomic JSON/NPZ writing, reloading, version stamps and checkpoints.

Every result is a JSON object (or NPZ archive) carrying ``"params"`` (the full parameter
set) and ``"version"`` (the toolkit version).  Files are written to a temporary name in the
same folder and renamed, so an interrupted run never leaves a half-written file.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__


def to_jsonable(obj: Any) -> Any:
    """NumPy arrays and scalars to lists and floats, recursively."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def atomic_replace(path: Path, write: Any, suffix: str) -> None:
    """Write through ``write(handle)`` to a temporary file in the same folder, then rename it
    over ``path``: readers see the old file or the complete new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` (plus ``version`` if absent) as JSON, atomically."""
    path = Path(path)
    payload = {"version": __version__, **to_jsonable(data)}
    text = json.dumps(payload, indent=1, allow_nan=True).encode()
    atomic_replace(path, lambda h: h.write(text), ".tmp")
    return path


def read_json(path: str | os.PathLike) -> dict:
    """Reload a JSON result."""
    with open(path) as handle:
        return json.load(handle)


def write_npz(path: str | os.PathLike, params: dict, **arrays: np.ndarray) -> Path:
    """Write arrays plus the parameters (as a JSON string) and version to NPZ, atomically."""
    path = Path(path)
    meta = json.dumps({"version": __version__, "params": to_jsonable(params)})
    atomic_replace(path, lambda h: np.savez(h, __meta__=np.array(meta), **arrays), ".npz")
    return path


def read_npz(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """Reload an NPZ result: (meta with params and version, arrays)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        arrays = {k: data[k] for k in data.files if k != "__meta__"}
    return meta, arrays


class Checkpoint:
    """A JSON checkpoint next to an output file (``<out>.partial.json``) for resumable runs.

    ``load(params)`` returns the saved progress only when it was made with the same params,
    so a changed command line never resumes someone else's run."""

    def __init__(self, out_path: str | os.PathLike) -> None:
        out = Path(out_path)
        self.path = out.with_name(out.name + ".partial.json")

    def load(self, params: dict) -> dict | None:
        if not self.path.exists():
            return None
        saved = read_json(self.path)
        return saved.get("progress") if saved.get("params") == to_jsonable(params) else None

    def save(self, params: dict, progress: dict) -> None:
        write_json(self.path, {"params": params, "progress": progress})

    def clear(self) -> None:
        if self.path.exists():
            self.path.unlink()
