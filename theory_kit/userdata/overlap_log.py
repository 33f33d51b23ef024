"""OverlapLog: record the order parameters of your own training loop, in the format ``compare``
reads.

Your loop keeps the keys k_h (an H×D array: NumPy, or a torch/JAX tensor — anything with
``__array__``; no such library is imported here) and knows the feature directions u_f (F×D,
orthonormal rows).  At the steps you choose, :meth:`OverlapLog.record` stores

    m_hf = k_h · u_f   (M = K Uᵀ, H×F),     Q_hh' = k_h · k_h'   (Q = K Kᵀ, H×H),

exactly the order parameters of docs/theory.md §4, with the keys in the convention of §2: the
score of head h on token l is s_hl = k_h · x_l with tokens x_l = z_l + 1[l = ε] U θ,
z_l ~ N(0, I_D), so that keys drawn as N(0, η²/D I) have Q ≈ η² I.  (If your scores are
k·x/√D, pass k/√D.)  :meth:`OverlapLog.save` writes ``steps``, ``M``, ``Q`` (with ``a``, ``b``,
``loss``, ``loss_err`` when recorded), ``D`` and the step size, as NPZ or JSON.

Three lines in a loop::

    log = OverlapLog(U, gamma=gamma)                 # U: F×D, before the loop
    log.record(step, K, loss=loss)                   # in the loop, every few hundred steps
    log.save("run.npz")                              # after it: compare --data run.npz
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..model.validation import ValidationError, as_finite_array, check_int, fail

U_TOL = 1e-6          # max |U Uᵀ − I|, as the log reader's (float32 directions pass)
SAVE_FORMATS = (".npz", ".json")


def as_numpy(value: Any, name: str) -> np.ndarray:
    """A finite float64 NumPy array of ``value``: a NumPy array, nested lists, or a tensor with
    ``__array__`` (a torch tensor is detached and moved to the CPU first, by duck typing: its
    library is never imported).

    >>> as_numpy([[1, 2]], "keys").dtype
    dtype('float64')
    """
    if hasattr(value, "detach"):     # torch: a tensor that requires grad refuses __array__
        value = value.detach()
    if hasattr(value, "cpu") and not isinstance(value, np.ndarray):
        value = value.cpu()
    if hasattr(value, "__array__") and not isinstance(value, np.ndarray):
        value = np.asarray(value)
    return as_finite_array(value, name)


class OverlapLog:
    """The overlaps M, Q (and a, b, the loss) of one training run at the steps you choose.

    Parameters
    ----------
    U : array_like, shape (F, D)
        The feature directions u_f as rows (orthonormal).
    gamma : float, optional
        The key step size in the toolkit's convention, k ← k − (γ/D)∇ of ½(y − ŷ)².
    lr : float, optional
        Or the raw learning rate of k ← k − lr·∇ (then γ = lr·D).

    Examples
    --------
    >>> import tempfile
    >>> U = np.eye(2, 50)                          # F = 2 directions in D = 50
    >>> log = OverlapLog(U, gamma=1.0)
    >>> K = np.full((3, 50), 0.1)                  # H = 3 keys
    >>> log.record(0, K)
    >>> log.record(100, 2 * K, loss=0.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    theory_kit.model.validation.ValidationError: loss: record it at every step or at none ...
    >>> log.record(100, 2 * K)
    >>> log.M.shape, round(float(log.Q[1, 0, 0]), 12)
    ((2, 3, 2), 2.0)
    >>> path = log.save(Path(tempfile.mkdtemp()) / "run.npz")
    >>> sorted(np.load(path).files)
    ['D', 'M', 'Q', 'gamma', 'steps']
    """

    def __init__(self, U: Any, *, gamma: float | None = None, lr: float | None = None) -> None:
        U_arr = as_numpy(U, "U")
        if U_arr.ndim != 2 or U_arr.shape[0] > U_arr.shape[1]:
            raise ValidationError(f"U: must be an array of shape (F, D) with F <= D, the "
                                  f"feature directions as rows (got shape {U_arr.shape})")
        gap = float(np.max(np.abs(U_arr @ U_arr.T - np.eye(U_arr.shape[0]))))
        if gap > U_TOL:
            fail("U", f"rows must be orthonormal (max |U Uᵀ − I| <= {U_TOL:g})", f"{gap:.3g}")
        for name, value in (("gamma", gamma), ("lr", lr)):
            if value is not None and not (np.isfinite(value) and value > 0):
                fail(name, "the step size must be a finite number > 0", value)
        if gamma is not None and lr is not None:
            fail("gamma", "give the step size either as gamma or as lr, not both", [gamma, lr])
        self.U = U_arr
        self.step_size = {"gamma": gamma} if gamma is not None else (
            {"lr": lr} if lr is not None else {})
        self._rows: dict[str, list] = {"steps": [], "M": [], "Q": []}

    @property
    def D(self) -> int:
        """The dimension of the keys and directions."""
        return int(self.U.shape[1])

    def record(self, step: int, keys: Any, *, a: Any = None, b: Any = None,
               loss: Any = None, loss_err: Any = None) -> None:
        """Record the overlaps of ``keys`` (H×D) after SGD step ``step`` (0 = before the first).

        ``a``, ``b`` (H,) and ``loss``, ``loss_err`` (numbers; the loss as E = E(y − ŷ)²,
        without ½) are optional, but each is recorded at every step or at none."""
        check_int(step, "step", 0)
        if self._rows["steps"] and step <= self._rows["steps"][-1]:
            fail("step", f"steps must increase (the last one recorded was "
                         f"{self._rows['steps'][-1]})", step)
        K = as_numpy(keys, "keys")
        H = self._rows["M"][0].shape[0] if self._rows["M"] else None
        if K.ndim != 2 or K.shape[1] != self.D or (H is not None and K.shape[0] != H):
            heads = "H" if H is None else str(H)
            raise ValidationError(f"keys: must be an array of shape ({heads}, D = {self.D}), "
                                  f"one key per head (got shape {K.shape})")
        extras = {"a": a, "b": b, "loss": loss, "loss_err": loss_err}
        values = {name: self._extra(name, value, K.shape[0]) for name, value in extras.items()}
        self._rows["steps"].append(int(step))
        self._rows["M"].append(K @ self.U.T)
        self._rows["Q"].append(K @ K.T)
        for name, value in values.items():
            if value is not None:
                self._rows.setdefault(name, []).append(value)

    def _extra(self, name: str, value: Any, H: int) -> np.ndarray | None:
        """An optional field, checked against its shape and against the earlier records."""
        first = len(self._rows["steps"]) == 0
        if (value is None) != (name not in self._rows) and not first:
            had = "none" if name not in self._rows else "one"
            raise ValidationError(f"{name}: record it at every step or at none (the first "
                                  f"record had {had})")
        if value is None:
            return None
        arr = as_numpy(value, name)
        want = (H,) if name in ("a", "b") else ()
        if arr.shape != want:
            raise ValidationError(f"{name}: must be an array of shape {want} (got shape "
                                  f"{arr.shape})")
        return arr

    def _array(self, name: str) -> np.ndarray:
        return np.asarray(self._rows[name], dtype=float if name != "steps" else np.int64)

    @property
    def steps(self) -> np.ndarray:
        """The recorded SGD steps."""
        return self._array("steps")

    @property
    def M(self) -> np.ndarray:
        """m_hf at every recorded step: times×H×F."""
        return self._array("M")

    @property
    def Q(self) -> np.ndarray:
        """Q_hh' at every recorded step: times×H×H."""
        return self._array("Q")

    def fields(self) -> dict[str, Any]:
        """What :meth:`save` writes: the log's fields by name."""
        if len(self._rows["steps"]) < 2:
            fail("steps", "record at least two steps before saving", len(self._rows["steps"]))
        out: dict[str, Any] = {name: self._array(name) for name in self._rows}
        return {**out, "D": self.D, **self.step_size}

    def save(self, path: str | Path) -> Path:
        """Write the log as NPZ or JSON (by the extension); returns the path.

        ``theory-kit compare --data PATH`` and ``theory-kit ode --from-log PATH`` read it."""
        path = Path(path)
        if path.suffix.lower() not in SAVE_FORMATS:
            fail("path", f"must end in one of {', '.join(SAVE_FORMATS)}", str(path))
        data = self.fields()
        if path.suffix.lower() == ".npz":
            from ..io.results import atomic_replace
            atomic_replace(path, lambda handle: np.savez(handle, **data), ".npz")
        else:
            from ..io.results import write_json
            write_json(path, data)
        return path
