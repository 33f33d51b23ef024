"""Input validation with one error style, and the toolkit's error types.

Every check raises :class:`ValidationError` (a ``ValueError``) with one message
style: ``<parameter>: <what is allowed> (got <value>)``.
"""
from __future__ import annotations

import reprlib
from typing import NoReturn

import numpy as np

PSD_TOL = 1e-9


class ValidationError(ValueError):
    """Bad input: the message names the parameter and the allowed range (CLI exit 2)."""


class OutputError(Exception):
    """An output cannot be written: path, permission, disk full, a lock held (CLI exit 3)."""


class ResourceError(Exception):
    """A request exceeds the memory or time bound (CLI exit 4); the message gives the
    estimate, the limit and the option that raises it."""


def fail(param: str, allowed: str, got: object) -> NoReturn:
    """Raise the toolkit's one error style: ``param: allowed (got value)``."""
    try:
        text = np.array2string(np.asarray(got), precision=4, threshold=12) if isinstance(
            got, (np.ndarray, list, tuple)) else repr(got)
    except ValueError:  # ragged nested lists cannot become an array; show them as given
        text = repr(got)
    raise ValidationError(f"{param}: {allowed} (got {' '.join(text.split())})")


def _holds_bool(x: object) -> bool:
    """Whether x (a scalar, an array or nested lists from JSON) holds a boolean anywhere.

    NumPy converts True/False to 1.0/0.0, so a log file or a flag with ``true`` in place of a
    number would otherwise be read silently.  Walked with a stack, not recursion: a file can
    nest lists thousands deep."""
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (bool, np.bool_)):
            return True
        if isinstance(item, np.ndarray):
            if item.dtype.kind == "b":
                return True
            if item.dtype.kind == "O":
                stack.extend(item.ravel().tolist())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def as_finite_array(x: object, param: str, ndim: int | None = None) -> np.ndarray:
    """Convert to a float array, rejecting booleans, NaN/inf and wrong dimensionality."""
    if _holds_bool(x):  # shown as given: converted, True would read as 1.0 in the message too
        fail(param, "entries must be numbers, not true/false",
             x if isinstance(x, np.ndarray) else reprlib.repr(x))
    try:
        arr = np.array(x, dtype=float)
    except (TypeError, ValueError):
        fail(param, "must be numeric", x)
    if ndim is not None and arr.ndim != ndim:
        fail(param, f"must be a {ndim}-dimensional array", x)
    if not np.all(np.isfinite(arr)):
        fail(param, "must be finite (no NaN or inf)", x)
    return arr


def check_int(value: object, param: str, minimum: int) -> int:
    """An integer ≥ minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        fail(param, f"must be an integer >= {minimum}", value)
    return int(value)


def check_psd(mat: np.ndarray, param: str, tol: float = PSD_TOL) -> None:
    """Symmetric positive semi-definite up to a relative tolerance (and finite: Q − MMᵀ of
    entries near 1e308 overflows to inf, and an inf tolerance would accept anything)."""
    if not np.all(np.isfinite(mat)):
        fail(param, "must be finite (its entries overflow float64; the inputs are too large)",
             mat)
    scale = max(1.0, float(np.max(np.abs(mat)))) if mat.size else 1.0
    if not np.allclose(mat, mat.T, atol=tol * scale, rtol=0):
        fail(param, "must be symmetric", mat)
    if mat.size and np.linalg.eigvalsh(0.5 * (mat + mat.T)).min() < -tol * scale:
        fail(param, "must be positive semi-definite", mat)


def check_nu(nu: object, param: str = "nu") -> np.ndarray:
    """Signal strengths ν_f > 0, as a 1-d array."""
    arr = np.atleast_1d(as_finite_array(nu, param))
    if arr.ndim != 1 or arr.size == 0 or np.any(arr <= 0):
        fail(param, "every signal strength must be > 0", arr)
    return arr
