"""The escape theory (``theory_kit.dynamics.escape``) as a figure piece, and the drawing of its
band.

An :class:`EscapePiece` is one ``escape_law`` computation (linearisation along the
head-symmetric ODE of a setting + samples of the linear process at each D); like the ODE and
simulation pieces it runs through ``panels.run_pieces`` (cached in the work folder, parallel).
Figs. 1, 6 and 11 use it: the predicted SGD band of τ₂ next to the ODE's τ₂ (Fig. 1), the
predicted ⟨τ₂⟩ ± std against D over the simulations (Fig. 6), the predicted ⟨τ₂⟩ at D = 10⁴
over the (ν₁, ν₂) plane (Fig. 11).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes

from ..dynamics.escape import escape_law
from ..expect.montecarlo import head_permutations
from .panels import Setting, drift_seconds, laplace_eval_seconds

# reference constants of the cost model (CPU seconds of the reference machine): the escape
# theory's evaluations cost about twice a plain drift evaluation of the same points, and
# sampling the linear process about 8 CPU s per 2000 runs and dimension D
JACOBIAN_COST_FACTOR = 2.0
SAMPLER_SECONDS_PER_RUN = 4e-3


@dataclass(frozen=True)
class EscapePiece:
    """The predicted law of τ_direction at the dimensions D for one setting: keys drawn at D
    (``given=False``) or from the setting's initial overlaps (``given=True``); the drift on
    ``engine`` (``escape_engine``: ``sobol`` with ``points``, ``laplace``, ``rqmc``, ``auto``)."""

    setting: Setting
    D: tuple[int, ...]
    runs: int = 2000
    points: int = 4096
    dt: float = 2.0
    every: float = 10.0
    given: bool = False
    direction: int = 2
    engine: str = "sobol"

    @property
    def name(self) -> str:
        key = self.setting.key(self.D, self.runs, self.points, self.dt, self.every, self.given,
                               self.direction, self.engine)
        return f"escape-{key}"

    def seconds(self) -> float:
        """RK4 along the trajectory (4 evaluations per step) plus 2n per Jacobian node (and a
        quarter-size check), at the ODE pieces' cost per evaluation (calibrated factor
        ``JACOBIAN_COST_FACTOR``; the deterministic engine's per evaluation where it is the
        one used), plus the sampler's runs at every D."""
        s = self.setting
        n = s.H * len(s.nu) + s.H * (s.H + 1) // 2
        evals = 4 * s.T / self.dt + (2 * n + 2) * (s.T / self.every + 6)
        if self.engine == "sobol":
            per_eval = drift_seconds(s, self.points * len(head_permutations(s.H)))
        else:
            per_eval = laplace_eval_seconds(s.H, s.L)
        return (JACOBIAN_COST_FACTOR * evals * per_eval
                + SAMPLER_SECONDS_PER_RUN * self.runs * len(self.D))

    def run(self, path: Path, progress: bool) -> dict:
        s = self.setting
        initial = s.initial().state if self.given else None
        res = escape_law(s.task(), s.act(), s.H, s.gamma, list(self.D), eta=s.eta,
                         initial=initial, T=s.T, direction=self.direction, runs=self.runs,
                         n_points=self.points, dt=self.dt, every=self.every, progress=progress,
                         engine=self.engine)
        lin = res["linearisation"]
        return {"params": res["params"], "per_D": res["prediction"]["per_D"],
                "lambda_rel_err": res["prediction"]["lambda_rel_err"], "t": lin["t"],
                "lambda": lin["lambda"], "errors": lin["errors"], "setting": s.params()}


def predicted(result: dict, key: str = "mean") -> np.ndarray:
    """One statistic of the predicted τ per D of an escape piece's result."""
    return np.array([row["tau"][key] for row in result["per_D"]], dtype=float)


def draw_band_over_d(ax: Axes, result: dict) -> None:
    """Predicted ⟨τ⟩ ± std against D (shaded band, line at the mean)."""
    D = np.array([row["D"] for row in result["per_D"]], dtype=float)
    mean, std = predicted(result), predicted(result, "std")
    label = r"theory $\langle\tau_2\rangle \pm$ std"   # one legend entry, band and line
    ax.fill_between(D, mean - std, mean + std, color="C1", alpha=0.18, lw=0, label=label)
    ax.plot(D, mean, "-", color="C1", lw=1.2, label=label)


def draw_band_in_time(ax: Axes, result: dict) -> None:
    """The predicted τ band of one D as a vertical span (mean ± std) with a line at the mean
    (one label: one legend entry drawing both)."""
    row = result["per_D"][0]["tau"]
    if not np.isfinite(row["mean"]):
        return
    label = r"$\tau_2$ SGD predicted (mean $\pm$ std)"
    ax.axvspan(row["mean"] - row["std"], row["mean"] + row["std"], color="C4", alpha=0.15,
               lw=0, label=label)
    ax.axvline(row["mean"], color="C4", lw=1.0, label=label)
