"""Import and validate a user's own training log (overlaps or raw keys over time).

A training log is what a user's PyTorch/JAX/NumPy code recorded while training the attention
layer of docs/theory.md §2 by online SGD at its own dimension D.  Two forms are accepted:

1. **Overlaps over time**: ``t`` (or ``steps``), ``M`` (times×H×F), ``Q`` (times×H×H),
   optionally ``a``, ``b`` (times×H) and a measured ``loss`` (times,) with its standard error
   ``loss_err`` (times,).
2. **Raw keys over time**: ``t`` (or ``steps``), ``K`` (times×H×D) and the signal directions
   ``U`` (D×F, orthonormal columns); the toolkit computes m_{hf} = k_h·u_f and
   Q_{hh'} = k_h·k_{h'}, i.e. ``M = K U`` and ``Q = K Kᵀ`` at every time.

Optional scalars: ``D`` (the dimension; implied by K), ``gamma`` (the step size in the
toolkit's convention k ← k − (γ/D)∇) or ``lr`` (the raw learning rate k ← k − lr·∇, so
γ = lr·D), and ``time_unit`` (``"t"`` or ``"steps"``).  Times in SGD steps are converted to
t = steps/D.  The ``loss`` must be in the units of the population error
E = E[(y − ŷ)²] (no factor ½), e.g. a test-set average of (y − ŷ)².

**Many runs at once.**  The per-run fields may carry a leading runs axis R: ``M``
(R×times×H×F), ``Q`` (R×times×H×H), ``K`` (R×times×H×D), ``a``, ``b`` (R×times×H), ``loss``,
``loss_err`` (R×times), with one shared ``t`` (or ``steps``), ``U`` and scalars
(NPZ and JSON).  A folder of log files is read as one run per file (or the runs of each
file), in the order of the file names; :func:`load_training_logs` reads both.

File formats (chosen by extension):

* ``.npz``: one array per field (scalars as 0-d arrays, ``time_unit`` as a string array);
* ``.json``: one object with the same field names (nested lists for arrays); ``error`` is
  accepted as another name for ``loss`` so the toolkit's own trajectories load too;
* ``.csv``: overlaps only, in long format with the header ``t,quantity,h,h2,f,value``
  (``steps`` instead of ``t`` for times in SGD steps).  ``quantity`` is one of
  ``M, Q, a, b, loss, loss_err``; indices are 0-based; unused index cells stay empty:
  M uses h and f, Q uses h and h2 (one triangle suffices; the other is mirrored),
  a and b use h, loss and loss_err use none.  Lines starting with ``#`` are comments, except
  ``# D = 1000``, ``# gamma = 1.0``, ``# lr = 0.001`` which set those scalars.

Every check raises :class:`~theory_kit.model.validation.ValidationError` naming the field: missing
fields, wrong shapes, non-finite values, times not strictly increasing, U not orthonormal,
Q not symmetric positive semi-definite or Q − M Mᵀ not positive semi-definite.
"""
from __future__ import annotations

import csv
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from ..io.results import read_json
from ..model.state import State
from ..model.validation import ValidationError, as_finite_array, check_int, check_psd, fail

FORMATS = (".npz", ".json", ".csv")
TIME_UNITS = ("t", "steps")
CSV_HEADER = ("t", "quantity", "h", "h2", "f", "value")
CSV_QUANTITIES = ("M", "Q", "a", "b", "loss", "loss_err")
CSV_SCALARS = ("D", "gamma", "lr")
U_TOL = 1e-6      # max |UᵀU − I| accepted: float32-saved orthonormal bases pass, random ones fail
PSD_TOL = 1e-6    # relative tolerance of the PSD checks on measured Q and Q − M Mᵀ
# the axes of one run's fields; a log of many runs puts a runs axis in front of each
RUN_AXES = {"M": "times, H, F", "Q": "times, H, H", "K": "times, H, D", "a": "times, H",
            "b": "times, H", "loss": "times", "loss_err": "times"}
SHARED_AXES = {"t": "times", "steps": "times", "U": "D, F"}


@dataclass(frozen=True)
class TrainingLog:
    """A validated training log: order parameters at increasing times t = steps/D.

    ``a``/``b``/``loss``/``loss_err`` are ``None`` when the file did not record them."""

    t: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray | None = None
    b: np.ndarray | None = None
    loss: np.ndarray | None = None
    loss_err: np.ndarray | None = None
    D: int | None = None
    gamma: float | None = None
    source: dict = field(default_factory=dict)

    @property
    def H(self) -> int:
        return self.M.shape[1]

    @property
    def F(self) -> int:
        return self.M.shape[2]

    @property
    def n_times(self) -> int:
        return len(self.t)

    def orthogonal_part(self) -> np.ndarray:
        """Q − M Mᵀ at every time (times×H×H)."""
        return self.Q - np.einsum("nhf,ngf->nhg", self.M, self.M)

    def state_at(self, index: int, a_default: np.ndarray, b_default: np.ndarray) -> State:
        """The order parameters at time ``t[index]``; unrecorded a, b take the given defaults."""
        a = a_default if self.a is None else self.a[index]
        b = b_default if self.b is None else self.b[index]
        return State(self.M[index], self.Q[index], a, b)

    def to_dict(self) -> dict:
        """All arrays and metadata, JSON-ready (arrays as nested lists via results.to_jsonable)."""
        out = {"t": self.t, "M": self.M, "Q": self.Q, "D": self.D, "gamma": self.gamma,
               "source": self.source}
        for name in ("a", "b", "loss", "loss_err"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


# ----------------------------------------------------------------------------- reading files
def read_fields(path: str | Path) -> dict[str, object]:
    """The raw fields of a log file by format (no validation beyond the format itself)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data: no such file: {path}")
    if not path.is_file():  # a FIFO or terminal would block the read, /dev/zero never ends
        fail("data", "must be a regular file (not a folder, FIFO, device or socket)", str(path))
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".csv":
        return _read_csv(path)
    fail("data", f"file must end in one of {', '.join(FORMATS)}", str(path))
    raise AssertionError  # unreachable


def _read_npz(path: Path) -> dict[str, object]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):   # a .npy array named .npz
            raise ValueError(f"it holds one {type(data).__name__}, not named arrays")
        with data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValidationError(f"data: {path} is not a readable NPZ archive ({exc})")
    fields: dict[str, object] = {k: v.item() if v.ndim == 0 else v for k, v in arrays.items()}
    return fields


def _read_json(path: Path) -> dict[str, object]:
    # strict: one object, UTF-8, no repeated keys, integers of at most 4300 digits
    data = read_json(path, "data")
    if "loss" not in data and "error" in data:
        data["loss"] = data["error"]
    return data


def _csv_index(cell: str, column: str, line: int) -> int | None:
    cell = cell.strip()
    if cell == "":
        return None
    try:
        value = int(cell)
    except ValueError:
        raise ValidationError(f"{column}: must be an integer index >= 0 "
                              f"(got {cell!r} on line {line})")
    if value < 0:
        raise ValidationError(f"{column}: must be an integer index >= 0 "
                              f"(got {value} on line {line})")
    return value


def _csv_float(cell: str, column: str, line: int) -> float:
    try:
        return float(cell)
    except ValueError:
        raise ValidationError(f"{column}: must be a number (got {cell!r} on line {line})")


def _csv_metadata(comment: str, fields: dict[str, object]) -> None:
    """``# key = value`` comment lines set the scalars D, gamma, lr."""
    key, sep, value = comment.lstrip("#").partition("=")
    key = key.strip()
    if sep and key in CSV_SCALARS:
        fields[key] = _csv_float(value.strip(), key, 0)


def _read_csv(path: Path) -> dict[str, object]:
    fields: dict[str, object] = {}
    rows: list[tuple[float, str, int | None, int | None, int | None, float, int]] = []
    header: list[str] | None = None
    with open(path, newline="") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if not row or not "".join(row).strip():
                continue
            if row[0].lstrip().startswith("#"):
                _csv_metadata(",".join(row), fields)
                continue
            if header is None:
                header = [c.strip() for c in row]
                if (len(header) != 6 or header[0] not in TIME_UNITS
                        or tuple(header[1:]) != CSV_HEADER[1:]):
                    fail("header", "CSV header must be 't,quantity,h,h2,f,value' "
                                   "(or 'steps,...' for times in SGD steps)", ",".join(header))
                continue
            if len(row) != 6:
                fail("row", f"every CSV row needs 6 cells (line {line})", ",".join(row))
            qty = row[1].strip()
            if qty not in CSV_QUANTITIES:
                fail("quantity", f"must be one of {', '.join(CSV_QUANTITIES)} (line {line})", qty)
            rows.append((_csv_float(row[0], header[0], line), qty, _csv_index(row[2], "h", line),
                         _csv_index(row[3], "h2", line), _csv_index(row[4], "f", line),
                         _csv_float(row[5], "value", line), line))
    if header is None:
        fail("header", "CSV file has no header line 't,quantity,h,h2,f,value'", str(path))
    fields.update(_assemble_csv(rows, header[0]))
    return fields


def _assemble_csv(rows: list, time_column: str) -> dict[str, object]:
    """Long-format rows to dense arrays; a missing or repeated entry is an error."""
    t_index: dict[float, int] = {}   # (a dict: a log of 20 000 times was quadratic here)
    for row in rows:
        t_index.setdefault(row[0], len(t_index))
    times = list(t_index)
    # index layout per quantity: which of (h, h2, f) it uses
    layout = {"M": (0, 2), "Q": (0, 1), "a": (0,), "b": (0,), "loss": (), "loss_err": ()}
    entries: dict[str, dict[tuple, float]] = {q: {} for q in CSV_QUANTITIES}
    for t, qty, h, h2, f, value, line in rows:
        idx = (h, h2, f)
        used = layout[qty]
        for pos, name in enumerate(("h", "h2", "f")):
            if (pos in used) != (idx[pos] is not None):
                need = "needs" if pos in used else "must leave empty"
                fail(name, f"quantity {qty} {need} column {name} (line {line})", idx[pos])
        key = (t_index[t],) + tuple(idx[p] for p in used)
        if key in entries[qty]:
            fail(qty, f"entry given twice at {time_column}={t} (line {line})", list(key[1:]))
        entries[qty][key] = value
    for qty in CSV_QUANTITIES:
        _check_index_extent(qty, [row for row in rows if row[1] == qty], layout[qty])
    out: dict[str, object] = {time_column: np.array(times)}
    for qty, found in entries.items():
        if found:
            out[qty] = _dense(qty, found, len(times), times, time_column)
    return out


def _check_index_extent(qty: str, rows: list, used: tuple[int, ...]) -> None:
    """Every index of a quantity below its largest must have rows (the array is dense), so
    a head index of 1e12 is bad input naming its column, not a 1e12-row allocation that ran
    out of memory.  Q's h and h2 index one set of heads (one triangle suffices)."""
    columns = [("h", "h2", "f")[p] for p in used]
    axes = [["h", "h2"]] if qty == "Q" else [[c] for c in columns]
    for names in axes:
        cells = [(row[2 + ("h", "h2", "f").index(n)], row[6], n) for row in rows for n in names]
        if not cells:
            continue
        top, line, column = max(cells)
        seen = len({index for index, _, _ in cells})
        if top >= seen:     # fewer distinct indices than top + 1: some have no rows
            fail(column, f"index {top} of {qty} (line {line}) leaves indices below it without "
                         f"rows: {qty} has rows for {seen} distinct value(s) of {column}, "
                         f"so its indices must be 0..{seen - 1}", top)


def _dense(qty: str, found: dict[tuple, float], n: int, times: list[float],
           time_column: str) -> np.ndarray:
    dims = [max(k[p] for k in found) + 1 for p in range(1, len(next(iter(found))))]
    if qty == "Q":
        dims = [max(dims)] * 2
        found = {**{(k[0], k[2], k[1]): v for k, v in found.items()}, **found}
    arr = np.full([n] + dims, np.nan)
    for key, value in found.items():
        arr[key] = value
    missing = np.argwhere(np.isnan(arr))
    if len(missing):
        i, *rest = missing[0]
        fail(qty, f"CSV has no row for {qty}{list(map(int, rest))} at {time_column}={times[i]}",
             f"{len(missing)} missing entries")
    return arr


# ----------------------------------------------------------------------------- validation
def overlaps_from_keys(K: np.ndarray, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """M = K U (times×H×F) and Q = K Kᵀ (times×H×H) from keys K (times×H×D) and U (D×F)."""
    return np.einsum("nhd,df->nhf", K, U), np.einsum("nhd,ngd->nhg", K, K)


def _scalar(fields: dict, name: str) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    arr = as_finite_array(value, name)
    if arr.ndim != 0:
        fail(name, "must be a single number", arr)
    return float(arr)


def _required(fields: dict, name: str, ndim: int, what: str) -> np.ndarray:
    """A required finite array of the given rank (``what`` describes its axes)."""
    if fields.get(name) is None:
        fail(name, f"required field missing (shape {what})", "nothing")
    return as_finite_array(fields[name], name, ndim=ndim)


def _array(fields: dict, name: str, shape: tuple, what: str, required: bool = False
           ) -> np.ndarray | None:
    """A finite array of exactly ``shape`` (``what`` describes the axes), or None if absent."""
    if fields.get(name) is None:
        if required:
            fail(name, f"required field missing (shape {what})", "nothing")
        return None
    arr = as_finite_array(fields[name], name, ndim=len(shape))
    if arr.shape != shape:
        fail(name, f"must have shape {what} = {shape}", arr.shape)
    return arr


def _dimension(fields: dict, D: int | None, K: np.ndarray | None) -> int | None:
    """D from the caller, the file and the keys; all that are given must agree."""
    found = {}
    if D is not None:
        found["--D"] = check_int(D, "D", 1)
    if fields.get("D") is not None:
        value = _scalar(fields, "D")
        assert value is not None                 # the field is there (checked above)
        if value != int(value) or value < 1:
            fail("D", "the file's D must be an integer >= 1", value)
        found["file field D"] = int(value)
    if K is not None:
        found["keys K (times×H×D)"] = K.shape[2]
    if len(set(found.values())) > 1:
        fail("D", "the dimensions given disagree", ", ".join(f"{k}: {v}" for k, v in found.items()))
    return next(iter(found.values()), None)


def _times(fields: dict, time_unit: str | None, D: int | None) -> tuple[np.ndarray, str]:
    """Times as t = steps/D, strictly increasing."""
    present = [k for k in TIME_UNITS if fields.get(k) is not None]
    if not present:
        fail("t", "required field missing: give times as 't' or as 'steps'", "nothing")
    if len(present) == 2:
        fail("t", "give times either as 't' or as 'steps', not both", present)
    column = present[0]
    unit = fields.get("time_unit", column)
    if not isinstance(unit, str) or unit not in TIME_UNITS:   # (an NPZ may hold an array)
        fail("time_unit", f"the file's time_unit must be one text, one of "
                          f"{', '.join(TIME_UNITS)}", unit)
    if column == "steps" and unit != "steps":
        fail("time_unit", "the file gives 'steps', so the unit is steps", unit)
    if time_unit is not None:
        if time_unit not in TIME_UNITS:
            fail("time_unit", f"must be one of {', '.join(TIME_UNITS)}", time_unit)
        if column == "steps" and time_unit != "steps":
            fail("time_unit", "the file gives its times as 'steps'", time_unit)
        unit = time_unit
    raw = as_finite_array(fields[column], column, ndim=1)
    if raw.size < 2:
        fail(column, "need at least two recorded times", raw)
    bad = np.flatnonzero(np.diff(raw) <= 0)
    if bad.size:
        i = int(bad[0])
        fail(column, f"times must be strictly increasing (index {i + 1} is not after index {i})",
             raw[i:i + 2])
    if unit == "steps":
        if D is None:
            fail("D", "needed to convert SGD steps to t = steps/D: pass --D or store D in the file",
                 None)
        t = raw / D
    else:
        t = raw
    check_step_gaps(t, column, D)
    return t, unit


def check_step_gaps(t: np.ndarray, column: str, D: int | None) -> None:
    """Records at least one SGD step apart (t gaps >= 1/D, up to rounding): a run records
    after whole steps, and a gap below one step gives the finite-D spread nothing to grow on
    (the verdict became "inf x the expected spread")."""
    if D is None:
        return
    gaps = np.diff(t)
    i = int(np.argmin(gaps))
    if gaps[i] < (1.0 - 1e-9) / D:
        fail(column, f"recorded times must be at least one SGD step apart (t gaps >= 1/D = "
                     f"{1.0 / D:.3g}; times in SGD steps: give them as 'steps'); index {i + 1} "
                     f"is {gaps[i]:.3g} after index {i}", t[i:i + 2])


def _check_orthonormal(U: np.ndarray, tol: float) -> None:
    gap = float(np.max(np.abs(U.T @ U - np.eye(U.shape[1]))))
    if gap > tol:
        fail("U", f"columns must be orthonormal (max |UᵀU − I| <= {tol:g})", f"{gap:.3g}")


def _check_overlaps(t: np.ndarray, M: np.ndarray, Q: np.ndarray, tol: float) -> None:
    """Q symmetric PSD and Q − M Mᵀ PSD at every time: keys must be able to realise them."""
    orth = Q - np.einsum("nhf,ngf->nhg", M, M)
    for i in range(len(t)):
        check_psd(Q[i], f"Q at t={t[i]:.6g}", tol)
        check_psd(orth[i], f"Q - M M^T at t={t[i]:.6g} (no keys realise these overlaps)", tol)


def _step_size(fields: dict, D: int | None) -> float | None:
    """γ in the toolkit's convention; ``lr`` (raw learning rate) converts as γ = lr·D."""
    gamma, lr = _scalar(fields, "gamma"), _scalar(fields, "lr")
    if gamma is not None and lr is not None:
        fail("gamma", "give the step size either as 'gamma' or as 'lr', not both", [gamma, lr])
    if lr is not None:
        if D is None:
            fail("D", "needed to convert the learning rate lr to gamma = lr*D", None)
        gamma = lr * D
    if gamma is not None and gamma <= 0:
        fail("gamma", "the step size must be > 0", gamma)
    return gamma


def log_from_fields(fields: dict, D: int | None = None, time_unit: str | None = None,
                    u_tol: float = U_TOL, psd_tol: float = PSD_TOL,
                    source: dict | None = None) -> TrainingLog:
    """Validate raw fields (either form) of one run into a :class:`TrainingLog`."""
    runs = run_count(fields)          # shapes first: a bad one is stated, never printed
    if runs is not None:
        fail("data", "this log has a runs axis; read its runs with load_training_logs "
                     "(compare and ode --from-log do)", f"{runs} runs")
    has_keys = fields.get("K") is not None or fields.get("U") is not None
    has_overlaps = fields.get("M") is not None or fields.get("Q") is not None
    if has_keys and has_overlaps:
        fail("data", "give either overlaps (M, Q) or raw keys (K, U), not both",
             sorted(k for k in ("M", "Q", "K", "U") if fields.get(k) is not None))
    K = _required(fields, "K", 3, "times×H×D, with U") if has_keys else None
    D_eff = _dimension(fields, D, K)
    t, unit = _times(fields, time_unit, D_eff)
    n = len(t)
    if has_keys:
        assert K is not None                     # read above when has_keys
        if K.shape[0] != n:
            fail("K", f"must have shape (times, H, D) with times = {n}", K.shape)
        U = _required(fields, "U", 2, "D×F, with K")
        if U.shape[0] != K.shape[2]:
            fail("U", f"must have shape (D, F) with D = {K.shape[2]} as in K", U.shape)
        _check_orthonormal(U, u_tol)
        M, Q = overlaps_from_keys(K, U)
        form = "keys"
    else:
        M = _required(fields, "M", 3, "times×H×F; give M and Q, or K and U")
        if M.shape[0] != n:
            fail("M", f"must have shape (times, H, F) with times = {n}", M.shape)
        # required=True: never None (a missing Q raised)
        Q = cast(np.ndarray, _array(fields, "Q", (n, M.shape[1], M.shape[1]), "(times, H, H)",
                                    required=True))
        form = "overlaps"
    H = M.shape[1]
    check_int(H, "H (heads in the log)", 1)
    if form == "overlaps":  # Gram matrices of actual keys are PSD by construction
        _check_overlaps(t, M, Q, psd_tol)
    extras = {name: _array(fields, name, (n, H), "(times, H)") for name in ("a", "b")}
    extras.update({name: _array(fields, name, (n,), "(times,)") for name in ("loss", "loss_err")})
    if extras["loss_err"] is not None and np.any(extras["loss_err"] < 0):
        fail("loss_err", "standard errors must be >= 0", extras["loss_err"])
    info = {**(source or {}), "form": form, "time_unit": unit}
    return TrainingLog(t, M, 0.5 * (Q + np.swapaxes(Q, 1, 2)), D=D_eff,
                       gamma=_step_size(fields, D_eff), source=info, **extras)


def load_training_log(path: str | Path, D: int | None = None, time_unit: str | None = None,
                      u_tol: float = U_TOL, psd_tol: float = PSD_TOL) -> TrainingLog:
    """Read and validate a training log (NPZ, JSON or CSV; overlaps or raw keys).

    ``D`` and ``time_unit`` override/complete the file: times in SGD steps become t = steps/D.
    Raises :class:`ValidationError` naming the bad field."""
    return log_from_fields(read_fields(path), D=D, time_unit=time_unit, u_tol=u_tol,
                           psd_tol=psd_tol, source={"path": str(path)})


# ----------------------------------------------------------------------------- many runs
def field_shape(value: object, name: str) -> tuple[int, ...]:
    """The shape of a field as read (an array or nested lists), without converting it.

    >>> field_shape([[1, 2], [3, 4]], "M")
    (2, 2)
    """
    if isinstance(value, str):        # a text field has no array shape (refused later)
        return ()
    try:
        return tuple(int(n) for n in np.shape(value))   # type: ignore[call-overload]
    except ValueError:                # NumPy refuses ragged nested lists
        raise ValidationError(f"{name}: must be a rectangular array, nested lists of equal "
                              f"lengths (got ragged nested lists)") from None


def _shape_error(name: str, shape: tuple[int, ...], runs: int | None) -> ValidationError:
    """One line: the shapes allowed for field ``name`` and the shape found (never the values)."""
    one = f"({RUN_AXES[name]})"
    if runs is None:
        allowed = f"{one} for one run or (runs, {RUN_AXES[name]}) with a runs axis"
    else:
        allowed = f"(runs, {RUN_AXES[name]}) with runs = {runs} as in the other fields"
    return ValidationError(f"{name}: must be an array of shape {allowed} (got shape {shape})")


def run_count(fields: dict) -> int | None:
    """The number of runs R of a log with a runs axis, None for a log of one run.

    The main field (``K`` for raw keys, else ``M``) decides; every other per-run field must
    then have the same leading axis, and the shared fields (``t``, ``steps``, ``U``) none.

    >>> run_count({"M": np.zeros((3, 5, 2, 2)), "Q": np.zeros((3, 5, 2, 2))})
    3
    >>> run_count({"M": np.zeros((5, 2, 2))}) is None
    True
    """
    main = "K" if fields.get("K") is not None else "M"
    if fields.get(main) is None:
        return None                   # the required-field checks name what is missing
    shape = field_shape(fields[main], main)
    rank = len(RUN_AXES[main].split(","))
    if len(shape) not in (rank, rank + 1):
        raise _shape_error(main, shape, None)
    runs = shape[0] if len(shape) == rank + 1 else None
    for name, axes in RUN_AXES.items():
        if name == main or fields.get(name) is None:
            continue
        got = field_shape(fields[name], name)
        want = len(axes.split(",")) + (runs is not None)
        if len(got) != want or (runs is not None and got[0] != runs):
            raise _shape_error(name, got, runs)
    for name, axes in SHARED_AXES.items():
        if fields.get(name) is not None:
            got = field_shape(fields[name], name)
            if len(got) != len(axes.split(",")):
                raise ValidationError(f"{name}: must be an array of shape ({axes}), shared "
                                      f"by all runs (got shape {got})")
    if runs == 0:
        raise ValidationError(f"{main}: the runs axis is empty (got shape {shape})")
    return runs


def split_runs(fields: dict) -> list[dict]:
    """One field dict per run: the per-run fields cut along the runs axis, the rest shared.

    >>> [f["M"].shape for f in split_runs({"M": np.zeros((2, 5, 1, 1)), "t": [0, 1]})]
    [(5, 1, 1), (5, 1, 1)]
    """
    runs = run_count(fields)
    if runs is None:
        return [fields]
    return [{k: (v[r] if k in RUN_AXES and v is not None else v) for k, v in fields.items()}
            for r in range(runs)]


def log_files(folder: Path) -> list[Path]:
    """The log files directly inside ``folder`` (by extension), in the order of their names."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in FORMATS and p.is_file())
    if not files:
        fail("data", f"the folder holds no log file ending in {', '.join(FORMATS)}", str(folder))
    return files


def load_training_logs(path: str | Path, D: int | None = None, time_unit: str | None = None,
                       u_tol: float = U_TOL, psd_tol: float = PSD_TOL) -> list[TrainingLog]:
    """Every run of a log file with a runs axis, of a one-run file, or of a folder of files.

    The runs are validated one by one (each error names its file and run) and must agree on
    H, F, D, the step size and the recorded times, which is what pooling them needs.

    Examples
    --------
    >>> import tempfile
    >>> M = np.zeros((3, 2, 1, 1)); Q = np.ones((3, 2, 1, 1))
    >>> path = Path(tempfile.mkdtemp()) / "runs.npz"
    >>> np.savez(path, t=[0.0, 1.0], M=M, Q=Q)
    >>> [log.source["run"] for log in load_training_logs(path)]
    [0, 1, 2]
    """
    path = Path(path)
    files = log_files(path) if path.is_dir() else [path]
    logs = []
    for file in files:
        fields = read_fields(file)
        per_run = split_runs(fields)
        for r, run_fields in enumerate(per_run):
            source = {"path": str(file), **({"run": r} if len(per_run) > 1 else {})}
            try:
                logs.append(log_from_fields(run_fields, D=D, time_unit=time_unit, u_tol=u_tol,
                                            psd_tol=psd_tol, source=source))
            except ValidationError as exc:
                where = file.name + (f", run {r}" if len(per_run) > 1 else "")
                raise ValidationError(f"{exc} [in {where}]") from None
    check_poolable(logs)
    return logs


def check_poolable(logs: list[TrainingLog]) -> None:
    """Runs judged together share H, F, D, the step size and the recorded times."""
    first = logs[0]
    for log in logs[1:]:
        for name, mine, theirs in (("M", log.M.shape[1:], first.M.shape[1:]),
                                   ("D", log.D, first.D), ("gamma", log.gamma, first.gamma)):
            if mine != theirs:
                fail(name, f"every run must agree with the first ({theirs}) to be pooled",
                     f"{mine} in {_where(log)}")
        if log.t.shape != first.t.shape or not np.array_equal(log.t, first.t):
            fail("t", "every run must record at the same times as the first to be pooled",
                 f"other times in {_where(log)}")


def _where(log: TrainingLog) -> str:
    run = log.source.get("run")
    return Path(log.source.get("path", "?")).name + ("" if run is None else f", run {run}")
