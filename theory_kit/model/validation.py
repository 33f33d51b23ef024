"""Input validation with one error style, and the toolkit's error types.

Every check raises :class:`ValidationError` (a ``ValueError``) with one message
style: ``<parameter>: <what is allowed> (got <value>)``.
"""
from __future__ import annotations

import numbers
import reprlib
from typing import NoReturn

import numpy as np

PSD_TOL = 1e-9
MAX_NU = 1e100   # largest signal strength: θ² · m² of scores stays finite in float64


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


def _foreign_entry(x: object) -> str | None:
    """What makes x (a scalar, an array or nested lists from JSON) not a real number anywhere:
    ``"bool"``, ``"text"`` or ``"complex"``; None when every entry is a number (None, JSON's
    null, reads as NaN and is refused as not finite).

    NumPy converts True/False to 1.0/0.0 and the text "1" to 1.0, and drops the imaginary
    part of a complex array with only a warning, so each would otherwise be read silently
    as another number.  Walked with a stack, not recursion: a file can nest lists thousands
    deep."""
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (bool, np.bool_)):
            return "bool"
        if isinstance(item, (str, bytes, np.str_, np.bytes_)):
            return "text"
        if isinstance(item, (complex, np.complexfloating)):
            return "complex"
        if isinstance(item, np.ndarray):
            kind = item.dtype.kind
            if kind in "bUSc":
                return {"b": "bool", "U": "text", "S": "text", "c": "complex"}[kind]
            if kind == "O":
                stack.extend(item.ravel().tolist())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


# what to say of each kind of entry that is not a real number
_FOREIGN = {"bool": "entries must be numbers, not true/false",
            "text": "must be numbers, not text",
            "complex": "must be real numbers (complex values are not accepted)"}


def as_finite_array(x: object, param: str, ndim: int | None = None) -> np.ndarray:
    """Convert to a float array, rejecting booleans, text, complex values, NaN/inf (and None)
    and wrong dimensionality."""
    foreign = _foreign_entry(x)
    if foreign is not None:  # shown as given: converted, True would read as 1.0 in the message
        fail(param, _FOREIGN[foreign], x if isinstance(x, np.ndarray) else reprlib.repr(x))
    try:
        arr = np.array(x, dtype=float)
    except (TypeError, ValueError):
        fail(param, "must be numeric", x)
    if ndim is not None and arr.ndim != ndim:
        fail(param, f"must be a {ndim}-dimensional array", x)
    if not np.all(np.isfinite(arr)):
        fail(param, "must be finite (no NaN or inf)", x)
    return arr


def check_number(value: object, param: str, *, minimum: float | None = None,
                 above: float | None = None, maximum: float | None = None) -> float:
    """A finite real number (not a bool, text, complex, None or an array), optionally
    >= ``minimum``, > ``above`` and <= ``maximum`` in size; returned as a float.

    The entry-point check of every scalar of the API: ``gamma='1'`` is refused, not coerced."""
    bounds = [f">= {minimum:g}" if minimum is not None else "",
              f"> {above:g}" if above is not None else ""]
    allowed = " and ".join(b for b in bounds if b)
    what = f"must be a finite number{' ' + allowed if allowed else ''}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail(param, what, value if not isinstance(value, np.ndarray) else value.tolist())
    number = float(value)
    if not np.isfinite(number):
        fail(param, what, value)
    if maximum is not None and abs(number) > maximum:   # first: also says it of -1e300
        fail(param, f"must be at most {maximum:g} in size (larger values overflow float64 "
                    "inside the computation)", value)
    if (minimum is not None and number < minimum) or (above is not None and number <= above):
        fail(param, what, value)
    return number


def check_flag(value: object, param: str) -> bool:
    """True or False (not 0/1, a string or None): a switch of the API."""
    if not isinstance(value, (bool, np.bool_)):
        fail(param, "must be True or False", value)
    return bool(value)


def check_choice(value: object, param: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        fail(param, f"must be one of {', '.join(choices)}", value)
    return value


def check_int(value: object, param: str, minimum: int) -> int:
    """An integer ≥ minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        fail(param, f"must be an integer >= {minimum}", value)
    return int(value)


def check_power_of_two(value: object, param: str, minimum: int = 2) -> int:
    """An integer ≥ minimum that is a power of two (Sobol point counts keep their balance).

    >>> check_power_of_two(1024, "budget")
    1024
    """
    n = check_int(value, param, minimum)
    if n & (n - 1):
        fail(param, "must be a power of two (Sobol balance)", value)
    return n


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
    """Signal strengths 0 < ν_f <= :data:`MAX_NU`, as a 1-d array."""
    arr = np.atleast_1d(as_finite_array(nu, param))
    if arr.ndim != 1 or arr.size == 0 or np.any(arr <= 0):
        fail(param, "every signal strength must be > 0", arr)
    if np.any(arr > MAX_NU):
        fail(param, f"every signal strength must be at most {MAX_NU:g} (the scores' squares "
                    "overflow float64 beyond)", arr)
    return arr
