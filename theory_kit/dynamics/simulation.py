"""The result of the simulate verb: finite-D SGD runs recorded at the same times."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..io.result import OverlapPlots, Result, provenance_of, xarray_module
from ..io.results import read_json, restore_non_finite, stamps

SIM_KEYS = ("t", "M", "Q", "a", "b", "error", "error_running")


@dataclass(repr=False)
class Simulation(OverlapPlots, Result):
    """Finite-D online SGD runs, recorded at the same times; arrays are runs first.

    Attributes
    ----------
    t : ndarray, shape (times,)
    M : ndarray, shape (runs, times, H, F)
    Q : ndarray, shape (runs, times, H, H)
    a, b : ndarray, shape (runs, times, H)
    error : ndarray, shape (runs, times)
        The population error at the recorded order parameters (Monte Carlo).
    error_running : ndarray, shape (runs, times)
        The mean of Δ + |e|² over the SGD steps since the previous record.
    params : dict
        Every input (the :class:`SimConfig`).
    provenance : dict
        The version and code digest that computed it.
    """

    kind: ClassVar[str] = "simulate"
    runs_axis: ClassVar[bool] = True
    default_label: ClassVar[str] = "SGD"

    t: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray
    b: np.ndarray
    error: np.ndarray
    error_running: np.ndarray
    params: dict
    provenance: dict = field(default_factory=stamps)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (*SIM_KEYS, "params")}

    @classmethod
    def from_dict(cls, data: dict) -> Simulation:
        return cls(**{k: np.array(data[k], dtype=float) for k in SIM_KEYS},
                   params=data["params"], provenance=provenance_of(data))

    def summary(self) -> str:
        p = self.params
        final = self.error[:, -1]
        return (f"Simulation({p.get('method')} SGD, D={p.get('D')}, {self.M.shape[0]} runs, "
                f"H={self.M.shape[2]}, gamma={p.get('gamma')}; {len(self.t)} times up to "
                f"t={self.t[-1]:g}; E(T)={final.mean():.4g} +/- {final.std():.2g} over runs)")

    def draw_series(self, axis: Any, values: np.ndarray, prefix: str) -> None:
        """The runs as a 10–90 % band around their median, or as every run's trace where
        they break a symmetry in different ways (``figures.series.draw_runs``)."""
        from ..figures.series import draw_runs
        draw_runs(axis, self.t, values, prefix)

    def to_xarray(self) -> Any:
        """The arrays labelled by ``run``, ``t``, ``head``, ``head2`` and ``feature``."""
        xr = xarray_module()
        dims = ("run", "t", "head")
        return xr.Dataset({"M": (dims + ("feature",), self.M), "Q": (dims + ("head2",), self.Q),
                           "a": (dims, self.a), "b": (dims, self.b),
                           "error": (("run", "t"), self.error)},
                          coords={"t": self.t}, attrs={"params": json.dumps(self.params)})


def load_result(path: str) -> Simulation:
    """Reload a ``theory-kit simulate`` output file."""
    return Simulation.from_dict(restore_non_finite(read_json(path)))
