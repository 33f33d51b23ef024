"""The result of the ODE verb: the order parameters along one integrated trajectory."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..io.result import (
    OverlapPlots,
    Result,
    engine_text,
    provenance_of,
    setting_text,
    xarray_module,
)
from ..io.results import read_json, restore_non_finite, stamps
from ..model.state import State

ROW_KEYS = ("t", "M", "Q", "a", "b", "error", "error_stderr", "drift_err")


@dataclass(repr=False)
class Trajectory(OverlapPlots, Result):
    """An ODE solution: the order parameters at the recorded times.

    Attributes
    ----------
    t : ndarray, shape (n,)
        Recorded times.
    M : ndarray, shape (n, H, F)
    Q : ndarray, shape (n, H, H)
    a, b : ndarray, shape (n, H)
    error, error_stderr : ndarray, shape (n,)
        The population error E and its standard error.
    params : dict
        Every input and the engine's parameters.
    drift_err : ndarray, shape (n,), optional
        The largest error estimate of the right-hand side at each time.
    stats : dict
        The integrator's counts (``rhs_evaluations``: engine evaluations in all,
        ``record_evaluations``: those made only to record E at requested times off the step
        grid, ``error_evaluations``: E-only evaluations made there instead, ``steps``).
    provenance : dict
        The version and code digest that computed it.
    """

    kind: ClassVar[str] = "ode"
    default_label: ClassVar[str] = "ODE"

    t: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray
    b: np.ndarray
    error: np.ndarray
    error_stderr: np.ndarray
    params: dict = field(default_factory=dict)
    drift_err: np.ndarray | None = None
    stats: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=stamps)

    def to_dict(self) -> dict:
        out = {"t": self.t, "M": self.M, "Q": self.Q, "a": self.a, "b": self.b,
               "error": self.error, "error_stderr": self.error_stderr, "params": self.params}
        if self.drift_err is not None:
            out["drift_err"] = self.drift_err
        if self.stats:
            out["stats"] = self.stats
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Trajectory:
        arrays = {k: np.asarray(data[k], dtype=float) for k in ROW_KEYS if k in data}
        return cls(**arrays, params=data.get("params", {}), stats=data.get("stats", {}),
                   provenance=provenance_of(data))

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        """Reload a trajectory file."""
        return cls.from_dict(restore_non_finite(read_json(path)))

    def state(self, i: int) -> State:
        """The order parameters at the i-th recorded time."""
        return State(self.M[i], self.Q[i], self.a[i], self.b[i])

    def summary(self) -> str:
        p = self.params
        return (f"Trajectory({setting_text(p)}; H={self.M.shape[1]}, gamma={p.get('gamma')}, "
                f"engine={engine_text(p)}; {len(self.t)} times up to t={self.t[-1]:g}; "
                f"E(T)={self.error[-1]:.6g})")

    def draw_series(self, axis: Any, values: np.ndarray, prefix: str) -> None:
        """One line per head (``figures.series.draw_lines``)."""
        from ..figures.series import draw_lines
        draw_lines(axis, self.t, values, prefix)

    def to_xarray(self) -> Any:
        """The arrays labelled by ``t``, ``head``, ``head2`` and ``feature``."""
        xr = xarray_module()
        dims = ("t", "head")
        return xr.Dataset({"M": (("t", "head", "feature"), self.M),
                           "Q": (("t", "head", "head2"), self.Q),
                           "a": (dims, self.a), "b": (dims, self.b),
                           "error": (("t",), self.error)},
                          coords={"t": self.t}, attrs={"params": json.dumps(self.params)})
