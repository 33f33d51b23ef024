"""Result files: atomic strict-JSON/NPZ writing, reloading, version stamps, locks, checkpoints.

Every result is a JSON object (or NPZ archive) carrying ``"params"`` (the full parameter
set), ``"version"`` (the toolkit version) and ``"code_digest"`` (:data:`CODE_DIGEST`, the
SHA-256 of the package's source).  A run resumes from a file only when both stamps are this
process's (:func:`is_current`): the version alone stays 0.1.0 across code changes, and a
result of older code resumed as current would be a wrong number with a current stamp.
Files are written to a temporary name in the same folder and renamed, so an interrupted run
never leaves a half-written file; a target that is not a regular file (``/dev/null``, a FIFO)
is written directly instead, never replaced.  JSON is strict (RFC 8259): a non-finite number
is written as ``null`` and listed under ``"non_finite"`` with what it was, so readers in any
language parse every file.
Files get mode 0666 minus the umask (0644 by default), like any other program's output.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import socket
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .. import __version__
from ..model.validation import OutputError, ValidationError

CHECKPOINT_SCHEMA = 2
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the theory_kit folder
NON_FINITE_NOTE = ("values that were NaN or +-inf, written as null so that the file is strict "
                   "JSON; keys are paths into this file")
ORPHAN_SECONDS = 3600.0  # a temporary file of unknown owner this old is a killed run's


def sources_digest(files: list[Path], root: Path = PACKAGE_DIR) -> str:
    """SHA-256 (hex) of the files' paths relative to ``root`` and their bytes, in the given
    order: a renamed, added or edited file changes it."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.resolve().relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def package_sources() -> list[Path]:
    """Every ``.py`` file of the installed ``theory_kit`` package, sorted."""
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


# Read once at import, like codegen's generator digest: a digest read later could see files a
# git checkout has replaced under a running process, and stamp the old code's numbers as new.
CODE_DIGEST = sources_digest(package_sources())


def stamps() -> dict[str, str]:
    """``{"version", "code_digest"}`` of this process: what every result file carries."""
    return {"version": __version__, "code_digest": CODE_DIGEST}


def is_current(data: dict) -> bool:
    """Whether a saved result or checkpoint was written by this version *and* this code."""
    return all(data.get(k) == v for k, v in stamps().items())


def stale_reason(data: dict) -> str:
    """Why :func:`is_current` refuses ``data``, for the set-aside warning."""
    return (f"written by other toolkit code (version {data.get('version')!r}, code "
            f"{str(data.get('code_digest'))[:12]!r}; this is {__version__!r}, "
            f"{CODE_DIGEST[:12]!r}), so its numbers may not be this code's")


def to_jsonable(obj: Any, non_finite: dict[str, str] | None = None, where: str = "") -> Any:
    """NumPy arrays and scalars to lists and floats, recursively; non-finite floats to None.

    ``non_finite``, if given, collects ``{path: "nan" | "inf" | "-inf"}`` for each value
    replaced (paths like ``run/error/3``), so a writer can say why a value is null."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, non_finite, f"{where}/{k}") for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc" and not np.all(np.isfinite(obj)):
            return to_jsonable(obj.astype(object).tolist(), non_finite, where)
        return obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, non_finite, f"{where}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        if non_finite is not None:
            non_finite[where.lstrip("/") or "/"] = "nan" if math.isnan(obj) else (
                "inf" if obj > 0 else "-inf")
        return None
    return obj


def strict_payload(data: dict) -> dict:
    """``data`` as strict-JSON-ready values, plus ``non_finite``/``non_finite_note`` when any
    NaN or inf was replaced by null."""
    found: dict[str, str] = {}
    payload = to_jsonable(data, found)
    if found:
        shown = dict(list(found.items())[:200])
        payload["non_finite"] = shown
        payload["non_finite_note"] = NON_FINITE_NOTE + (
            f" ({len(found)} values, first 200 listed)" if len(found) > 200 else "")
    return payload


def restore_non_finite(data: dict) -> dict:
    """The inverse of :func:`strict_payload` for a reloaded file: each value listed under
    ``non_finite`` (a path such as ``run/error/3``) becomes NaN or ±inf again, and the two
    bookkeeping fields are dropped.  Paths that do not resolve are left as they are."""
    found = data.get("non_finite")
    if not isinstance(found, dict):
        return data
    data = {k: v for k, v in data.items() if k not in ("non_finite", "non_finite_note")}
    for where, what in found.items():
        *parents, last = str(where).split("/")
        node: Any = data
        try:
            for key in parents:
                node = node[int(key)] if isinstance(node, list) else node[key]
            index = int(last) if isinstance(node, list) else last
            if node[index] is None:
                node[index] = float(what)
        except (KeyError, IndexError, ValueError, TypeError):
            continue
    return data


def dumps_strict(data: dict, indent: int | None = None) -> str:
    """JSON text of :func:`strict_payload` (``allow_nan=False`` guarantees strictness)."""
    return json.dumps(strict_payload(data), indent=indent, allow_nan=False)


# ----------------------------------------------------------------------------- writing
def _umask() -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)  # elsewhere: read it by setting it (and restore at once)
    os.umask(old)
    return old


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_orphans(path: Path, suffix: str) -> None:
    """Delete temporary files of earlier writes of ``path`` whose writer was killed.

    Names are ``.<name>.<pid>.<random><suffix>``: the file is an orphan when that process
    is gone; older-style names without a pid count once they are over an hour old."""
    prefix = f".{path.name}."
    try:
        candidates = [p for p in path.parent.iterdir()
                      if p.name.startswith(prefix) and p.name.endswith(suffix)]
    except OSError:
        return
    for tmp in candidates:
        pid_text = tmp.name[len(prefix):].split(".", 1)[0]
        try:
            orphan = (not _pid_alive(int(pid_text))) if pid_text.isdigit() else (
                time.time() - tmp.stat().st_mtime > ORPHAN_SECONDS)
            if orphan and tmp.is_file():
                tmp.unlink()
        except OSError:
            continue


def _special_target(path: Path) -> bool:
    """True for an existing target that must be written in place (device, FIFO, socket)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"out: cannot write {path} ({exc.strerror})") from exc
    if stat.S_ISDIR(mode):
        raise OutputError(f"out: {path} is a directory, not a file")
    if stat.S_ISSOCK(mode):
        raise OutputError(f"out: {path} is a socket; results go to a regular file, a FIFO "
                          "or a device such as /dev/null")
    return not stat.S_ISREG(mode)


FIFO_WAIT = 5.0


def _open_in_place(path: Path) -> BinaryIO:
    """A device or FIFO opened for writing; a FIFO that no process opens for reading within
    :data:`FIFO_WAIT` seconds is refused (a blocking open would wait forever for a mistyped
    --out; a reader started together with the run gets the time to open its end)."""
    deadline = time.monotonic() + FIFO_WAIT
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() > deadline:
                raise OutputError(f"out: {path} is a FIFO that no process is reading "
                                  f"(waited {FIFO_WAIT:g} s)") from exc
            time.sleep(0.05)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def atomic_replace(path: Path, write: Callable[[Any], Any], suffix: str) -> None:
    """Write through ``write(handle)`` to a temporary file in the same folder, then rename it
    over ``path``: readers see the old file or the complete new one, never a partial one.

    A path that exists and is not a regular file (``/dev/null``, a FIFO) is written
    directly, never replaced.  OS failures (permission, no space, name too long, a parent
    that is a file) raise :class:`OutputError` naming the path."""
    path = Path(path)
    try:
        if str(path) in ("", "."):
            raise OutputError("out: must be a file name (got an empty path)")
        if _special_target(path):
            with _open_in_place(path) as handle:
                write(handle)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_orphans(path, suffix)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.",
                                   suffix=suffix)
    except OSError as exc:
        raise OutputError(f"out: cannot write {path} ({exc.strerror or exc})") from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"out: cannot write {path} ({exc.strerror or exc})") from exc
        raise


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` (plus the :func:`stamps` it lacks) as strict JSON, atomically.

    Non-finite numbers become null and are listed under ``non_finite``."""
    path = Path(path)
    text = dumps_strict({**stamps(), **data}, indent=1).encode()
    atomic_replace(path, lambda h: h.write(text), ".tmp")
    return path


MAX_JSON_BYTES = 2 * 1024 ** 3


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object whose keys are all different (``json`` would keep the last of a repeated
    key silently; a file whose meaning depends on the reader is refused)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        # set.add returns None (falsy), so this finds the first key seen twice
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {dup[:40]!r} appears twice in one object")
    return out


def read_json(path: str | os.PathLike, param: str = "file") -> dict:
    """Reload a JSON result; unreadable, non-UTF-8, malformed, too deeply nested or
    non-object content raises ValidationError ``<param>: ...`` (one line)."""
    path = Path(path)
    try:
        info = path.stat()
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_JSON_BYTES:
            raise ValidationError(f"{param}: {path} is larger than 2 GiB; not a result file")
        if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
            # a FIFO or a terminal would block the read forever, /dev/zero never ends
            raise ValidationError(f"{param}: {path} is not a regular file (a FIFO, device or "
                                  "socket); give a JSON file")
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle, object_pairs_hook=_unique_keys)
    except FileNotFoundError:
        raise ValidationError(f"{param}: {path} does not exist")
    except IsADirectoryError:
        raise ValidationError(f"{param}: {path} is a directory, not a JSON file")
    except PermissionError:
        raise ValidationError(f"{param}: {path} cannot be read (permission denied)")
    except UnicodeDecodeError:
        raise ValidationError(f"{param}: {path} is not UTF-8 text (not a JSON file)")
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{param}: {path} is not valid JSON ({exc.msg} at line "
                              f"{exc.lineno}, column {exc.colno})")
    except RecursionError:
        raise ValidationError(f"{param}: {path} is nested too deeply to be a result file")
    except OSError as exc:  # a symlink loop, a name too long, an I/O error
        raise ValidationError(f"{param}: {path} cannot be read ({exc.strerror or exc})")
    except ValueError as exc:  # an integer of more than 4300 digits, a duplicated key
        raise ValidationError(f"{param}: {path} is not a result file ({exc})")
    if not isinstance(data, dict):
        raise ValidationError(f"{param}: {path} must hold a JSON object, not a "
                              f"{type(data).__name__}")
    return data


def write_npz(path: str | os.PathLike, params: dict, **arrays: np.ndarray) -> Path:
    """Write arrays plus the parameters (as a JSON string) and :func:`stamps` to NPZ,
    atomically."""
    path = Path(path)
    meta = json.dumps(strict_payload({**stamps(), "params": params}),
                      allow_nan=False)
    # numpy's stub types **kwds as if they could be its allow_pickle flag: they are array names
    atomic_replace(path, lambda h: np.savez(h, __meta__=np.array(meta), **arrays),  # type: ignore[arg-type]
                   ".npz")
    return path


def read_npz(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """Reload an NPZ result: (meta with params and stamps, arrays)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        arrays = {k: data[k] for k in data.files if k != "__meta__"}
    return meta, arrays


def warn(message: str) -> None:
    """A ``UserWarning`` (the CLI prints warnings as one ``theory-kit: warning:`` line)."""
    warnings.warn(" ".join(message.split()), UserWarning, stacklevel=3)


def set_aside(path: Path, why: str) -> Path | None:
    """Rename a foreign or corrupt file to ``<name>.bad-<time>-<pid>`` and warn; the caller
    starts clean.  Returns the new name (None if it could not be moved)."""
    target = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, target)
    except OSError:
        warn(f"{path} is {why} and could not be set aside; ignoring it")
        return None
    warn(f"{path} is {why}; set aside as {target.name}, starting clean")
    return target


def read_piece(path: Path) -> dict | None:
    """A finished piece of work (``workdir/<piece>.json``), or None when it is missing,
    unreadable or written by other code (then it is set aside, with a warning, and the piece
    is recomputed)."""
    if not path.exists():
        return None
    try:
        data = read_json(path)
    except ValidationError:
        set_aside(path, "not a readable result file")
        return None
    return current_or_set_aside(path, data)


def current_or_set_aside(path: Path, data: dict) -> dict | None:
    """``data`` (read from ``path``) when :func:`is_current`, else None with the file set
    aside: kept under another name, since older code's result may still be worth a look."""
    if is_current(data):
        return data
    set_aside(path, stale_reason(data))
    return None


# ----------------------------------------------------------------------------- locks
class OutputLock:
    """``<out>.lock``: one run writes a given output at a time.

    The lock file holds ``host pid``; a lock left by a dead process on this host is taken
    over.  A live one raises :class:`OutputError` (the CLI's exit 3) before any work.
    Targets that are not regular files or folders (``/dev/null``) are not locked."""

    def __init__(self, out_path: str | os.PathLike) -> None:
        if not str(out_path).strip():
            raise OutputError("out: must be a file or folder name (got an empty or blank path)")
        out = Path(out_path).absolute()
        if not out.name:  # the root folder
            raise OutputError(f"out: must name a file or a folder below / (got {out_path!r})")
        self.out = out
        self.path = out.with_name(out.name + ".lock")
        self.held = False

    def acquire(self) -> "OutputLock":
        if self.out.exists() and not (self.out.is_file() or self.out.is_dir()):
            return self
        me = f"{socket.gethostname()} {os.getpid()}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"out: cannot write {self.out} ({exc.strerror or exc}: "
                              f"{self.path.parent})") from exc
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                if self._stale():
                    try:
                        self.path.unlink()
                    except OSError:
                        pass
                    continue
                raise OutputError(f"out: another theory-kit run ({self._owner()}) is writing "
                                  f"{self.out}; wait for it, or delete {self.path} if it is "
                                  "not running")
            except OSError as exc:
                raise OutputError(f"out: cannot write {self.out} ({exc.strerror or exc})") from exc
            with os.fdopen(fd, "w") as handle:
                handle.write(me + "\n")
            self.held = True
            return self
        raise OutputError(f"out: could not lock {self.out} (remove {self.path})")

    def _owner(self) -> str:
        try:
            host, pid = self.path.read_text().split()[:2]
            return f"pid {pid} on {host}"
        except (OSError, ValueError):
            return "unknown process"

    def _stale(self) -> bool:
        try:
            host, pid = self.path.read_text().split()[:2]
        except (OSError, ValueError):
            # unreadable or half-written: stale once it is older than a few seconds
            try:
                return time.time() - self.path.stat().st_mtime > 10
            except OSError:
                return True
        return host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))

    def release(self) -> None:
        if self.held:
            try:
                self.path.unlink()
            except OSError:
                pass
            self.held = False

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ----------------------------------------------------------------------------- checkpoints
def params_digest(data: Any) -> str:
    """SHA-256 of the canonical strict JSON of ``data`` (key order does not matter)."""
    text = json.dumps(to_jsonable(data), sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


class Checkpoint:
    """A JSON checkpoint next to an output file (``<out>.partial.json``) for resumable runs.

    The file carries ``schema`` (:data:`CHECKPOINT_SCHEMA`), the :func:`stamps`, the params
    and a digest of params and progress.  ``load(params)`` returns the saved progress only
    when all of them check out and the params and code are this run's; a foreign,
    older-schema, corrupt, hand-edited or other-code checkpoint is set aside (renamed, with a
    warning) and the run starts clean.  For an output that is not a regular file
    (``/dev/null``) there is no checkpoint."""

    def __init__(self, out_path: str | os.PathLike) -> None:
        out = Path(out_path)
        self.path = out.with_name(out.name + ".partial.json")
        self.enabled = not (out.exists() and not out.is_file())

    def load(self, params: dict) -> dict | None:
        if not self.enabled or not self.path.exists():
            return None
        try:
            saved = read_json(self.path, "checkpoint")
        except ValidationError:
            set_aside(self.path, "not a readable checkpoint")
            return None
        if saved.get("schema") != CHECKPOINT_SCHEMA or "progress" not in saved:
            set_aside(self.path, f"a checkpoint of another format (schema "
                                 f"{saved.get('schema')!r}, expected {CHECKPOINT_SCHEMA})")
            return None
        try:
            intact = saved.get("digest") == params_digest([saved.get("params"), saved["progress"]])
        except (TypeError, ValueError):
            intact = False
        if not intact:
            set_aside(self.path, "a corrupt checkpoint (its digest does not match)")
            return None
        if saved.get("params") != to_jsonable(params):
            set_aside(self.path, "a checkpoint of a run with other parameters")
            return None
        if current_or_set_aside(self.path, saved) is None:
            return None
        return saved["progress"]

    def save(self, params: dict, progress: dict) -> None:
        if not self.enabled:
            return
        params, progress = to_jsonable(params), to_jsonable(progress)
        write_json(self.path, {"schema": CHECKPOINT_SCHEMA, "params": params,
                               "progress": progress,
                               "digest": params_digest([params, progress])})

    def clear(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()
