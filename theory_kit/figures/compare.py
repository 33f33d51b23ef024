"""Finite-D simulation against the ODE, side by side (the four panels of the paper's Fig. 1).

Panels: the population error; m_{h1} (the constant direction); m_{h2} (the first flipping
direction, when F ≥ 2); the orthogonal component diag(Q − M Mᵀ) of each head.  Simulation:
dots at the recorded times, mean ± run-to-run standard deviation; ODE: lines.  The ODE is
interpolated linearly in t at the simulation times, and each quantity's deviation is
|mean_sim − ODE| / std_sim; the report gives the largest one (and where it occurs).

Inputs are the dicts of a ``theory-kit simulate`` file (arrays runs × times × …) and of a
``theory-kit ode`` file (arrays times × …).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..io.results import read_json, write_json
from ..model.validation import ValidationError
from .style import label_axes, new_figure, series_colors

PANELS = ("error", "m_f1", "m_f2", "orthogonal")
PANEL_LABELS = {"error": "population error E", "m_f1": r"$m_{h1}$ (constant direction)",
                "m_f2": r"$m_{h2}$ (flipping direction)",
                "orthogonal": r"$(Q - MM^\top)_{hh}$"}


def panel_series(data: dict, runs_axis: bool) -> dict[str, np.ndarray]:
    """The plotted quantities, each with a trailing series axis (heads; 1 for the error).

    With ``runs_axis`` the arrays are runs × times × …, otherwise times × …."""
    M = np.asarray(data["M"], dtype=float)
    Q = np.asarray(data["Q"], dtype=float)
    ortho = np.diagonal(Q - M @ np.swapaxes(M, -1, -2), axis1=-2, axis2=-1)
    out = {"error": np.asarray(data["error"], dtype=float)[..., None], "m_f1": M[..., 0],
           "orthogonal": ortho}
    if M.shape[-1] >= 2:
        out["m_f2"] = M[..., 1]
    expected = 4 if runs_axis else 3
    if M.ndim != expected:
        raise ValidationError(f"M: must have {expected} axes "
                              f"({'runs x ' if runs_axis else ''}times x H x F) (got {M.shape})")
    return out


@dataclass
class Comparison:
    """Per panel: simulation mean and spread (times × series), the ODE at the simulation
    times, and the deviation |mean − ODE| / spread; plus the ODE on its own grid for lines."""

    t_sim: np.ndarray
    t_ode: np.ndarray
    sim_mean: dict[str, np.ndarray]
    sim_spread: dict[str, np.ndarray]
    ode_at_sim: dict[str, np.ndarray]
    ode: dict[str, np.ndarray]
    deviation: dict[str, np.ndarray]
    runs: int

    @property
    def max_deviation(self) -> float:
        """Largest |mean_sim − ODE| in units of the run-to-run std, over panels, times, heads."""
        vals = [np.nanmax(d) for d in self.deviation.values() if np.any(np.isfinite(d))]
        return float(max(vals)) if vals else float("nan")

    def worst(self) -> dict:
        """Where the largest deviation occurs: panel, time, series index."""
        best: dict[str, Any] = {"panel": None, "t": None, "series": None, "deviation": -np.inf}
        for name, dev in self.deviation.items():
            if np.any(np.isfinite(dev)):
                i, j = np.unravel_index(np.nanargmax(dev), dev.shape)
                if dev[i, j] > best["deviation"]:
                    best = {"panel": name, "t": float(self.t_sim[i]), "series": int(j),
                            "deviation": float(dev[i, j])}
        return best

    def to_dict(self) -> dict:
        return {"t_sim": self.t_sim, "t_ode": self.t_ode, "runs": self.runs,
                "sim_mean": self.sim_mean, "sim_spread": self.sim_spread,
                "ode_at_sim": self.ode_at_sim, "ode": self.ode, "deviation": self.deviation,
                "max_deviation": self.max_deviation, "worst": self.worst()}


def compare(sim: dict, ode: dict) -> Comparison:
    """Simulation mean ± std over runs against the ODE interpolated at the simulation times.

    Deviations are in units of the run-to-run std (ddof = 1); where that std is zero (e.g. a
    shared initial condition at t = 0) the deviation is 0 if the values agree and inf if not;
    with a single run it is NaN unless they agree."""
    t_sim = np.asarray(sim["t"], dtype=float)
    t_ode = np.asarray(ode["t"], dtype=float)
    if t_sim.size and (t_sim.min() < t_ode.min() - 1e-9 or t_sim.max() > t_ode.max() + 1e-9):
        raise ValidationError(f"t: the ODE file must cover the simulation times "
                              f"[{t_sim.min():g}, {t_sim.max():g}] (it covers "
                              f"[{t_ode.min():g}, {t_ode.max():g}])")
    s_series, o_series = panel_series(sim, True), panel_series(ode, False)
    runs = s_series["error"].shape[0]
    mean, spread, at_sim, dev = {}, {}, {}, {}
    for name in s_series.keys() & o_series.keys():
        vals = s_series[name]
        mean[name] = vals.mean(axis=0)
        spread[name] = vals.std(axis=0, ddof=1) if runs > 1 else np.full(mean[name].shape, np.nan)
        at_sim[name] = np.stack([np.interp(t_sim, t_ode, col) for col in o_series[name].T], -1)
        diff = np.abs(mean[name] - at_sim[name])
        with np.errstate(divide="ignore", invalid="ignore"):
            dev[name] = np.where(diff == 0, 0.0, diff / spread[name])
    return Comparison(t_sim, t_ode, mean, spread, at_sim, o_series, dev, runs)


def comparison_figure(comp: Comparison, title: str | None = None) -> Figure:
    """Four panels (error, m along f = 1, m along f = 2, orthogonal part): dots ± std for the
    simulation, lines for the ODE, one colour per head."""
    names = [p for p in PANELS if p in comp.sim_mean]
    fig, axes = new_figure(1, len(names))
    for ax, name in zip(axes, names):
        n_series = comp.sim_mean[name].shape[-1]
        colors = series_colors(n_series)
        for j in range(n_series):
            tag = "" if name == "error" else f" h={j + 1}"
            ax.plot(comp.t_ode, comp.ode[name][:, j], color=colors[j], label=f"ODE{tag}")
            ax.errorbar(comp.t_sim, comp.sim_mean[name][:, j],
                        yerr=np.nan_to_num(comp.sim_spread[name][:, j]), fmt="o", ms=3,
                        color=colors[j], capsize=2, label=f"SGD{tag}" if j == 0 else None)
        label_axes(ax, "t = steps / D", PANEL_LABELS[name],
                   legend=(name == names[0]) or n_series > 1)
    worst = comp.worst()
    fig.suptitle((title + "; " if title else "") + f"{comp.runs} runs, largest deviation "
                 f"{comp.max_deviation:.2f} std ({worst['panel']}, t = {worst['t']})", fontsize=9)
    fig.tight_layout()
    return fig


def write_comparison(sim_path: str | Path, ode_path: str | Path, out_prefix: str | Path,
                     title: str | None = None) -> tuple[Path, Path, Comparison]:
    """Read a simulation file and an ODE file; write ``<prefix>.png`` and ``<prefix>.json``
    (the plotted data, the deviations, both files' params)."""
    sim, ode = read_json(sim_path), read_json(ode_path)
    comp = compare(sim, ode)
    prefix = Path(out_prefix)
    png, js = prefix.with_suffix(".png"), prefix.with_suffix(".json")
    fig = comparison_figure(comp, title)
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.name}.tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(png)
    write_json(js, {**comp.to_dict(), "params": {"simulation": sim.get("params"),
                                                  "ode": ode.get("params")}})
    return png, js, comp
