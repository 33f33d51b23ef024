"""Finite-D simulation against the ODE, side by side (the four panels of the paper's Fig. 1).

Panels: the population error; m_{h1} (the constant direction); m_{h2} (the first flipping
direction, when F ≥ 2); the orthogonal component diag(Q − M Mᵀ) of each head.  Simulation:
a 10–90 % band of the runs around their median at the recorded times (each run where the runs
break a symmetry in different ways, see :mod:`theory_kit.figures.series`); ODE: lines.  The ODE is
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
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..io.results import read_json, write_json
from ..model.validation import ValidationError
from .series import (
    draw_band,
    draw_lines,
    draw_mean_std,
    draw_points,
    draw_runs,
    series_label,
    series_legend,
    series_style,
)
from .style import label_axes, new_figure

PANELS = ("error", "m_f1", "m_f2", "orthogonal")
PANEL_LABELS = {"error": "population error E", "m_f1": r"$m_{h1}$ (constant direction)",
                "m_f2": r"$m_{h2}$ (flipping direction)",
                "orthogonal": r"$(Q - MM^\top)_{hh}$"}


def panel_label(name: str, prior: str | None = None) -> str:
    """The y label of panel ``name``; the directions are named "constant" and "flipping" only
    for the flipping prior (a Gaussian prior's are u_1 and u_2, by their strengths ν_f).

    >>> panel_label("m_f2", "gaussian")
    '$m_{h2}$ (direction $u_2$)'
    """
    if prior in (None, "flipping") or name not in ("m_f1", "m_f2"):
        return PANEL_LABELS[name]
    f = name[-1]
    return rf"$m_{{h{f}}}$ (direction $u_{f}$)"


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


def comparison_figure(comp: Comparison, title: str | None = None,
                      runs: dict[str, np.ndarray] | None = None) -> Figure:
    """Four panels (error, m along f = 1, m along f = 2, orthogonal part): lines for the
    ODE, one colour and style per head, and the simulation as a 10–90 % band around the
    median of its ``runs`` (panel → runs × times × series; every run's trace where they break
    a symmetry in different ways), or as mean ± std without them; one legend under the
    panels.  The title gives the largest deviation of :meth:`Comparison.worst`."""
    names = [p for p in PANELS if p in comp.sim_mean]
    fig, axes = new_figure(1, len(names), panel_size=(3.3, 2.6))
    for ax, name in zip(axes, names):
        draw_lines(ax, comp.t_ode, comp.ode[name], "ODE")
        if runs is not None and name in runs:
            draw_runs(ax, comp.t_sim, runs[name], "SGD")
        else:
            draw_mean_std(ax, comp.t_sim, comp.sim_mean[name], comp.sim_spread[name], "SGD")
        label_axes(ax, r"$t$ = steps / $D$", PANEL_LABELS[name], legend=False)
    worst = comp.worst()
    fig.suptitle((title + "; " if title else "") + f"{comp.runs} runs, largest deviation "
                 f"|mean − ODE| = {worst['deviation']:.2f} std ({worst['panel']}, "
                 f"series {worst['series']}, t = {worst['t']:g})", fontsize=9)
    series_legend(fig, axes, max(comp.sim_mean[name].shape[-1] for name in names))
    return fig


# ----------------------------------------------------------------------------- a user's log
SPREAD_TEXT = "± expected spread"   # the band drawn when the simulated runs were not kept
@dataclass
class LogOverlay:
    """A user's training log against the theory, as ``compare.png`` draws it.

    Per panel (``error``, ``m_f1``, ``m_f2``, ``orthogonal``), arrays times × series: the
    user's run (``data``), the ODE from its first state (``theory``), the expected spread
    sqrt(σ_D² + σ_MC² [+ loss_err²]) (``spread``) and, when kept, the simulated runs at the
    log's D (``runs``, runs × times × series).  ``z`` holds z(t) of every quantity that
    enters the verdict, and ``worst`` is the verdict's own record of its largest |z|."""

    t: np.ndarray
    data: dict[str, np.ndarray]
    theory: dict[str, np.ndarray]
    spread: dict[str, np.ndarray]
    runs: dict[str, np.ndarray] | None
    z: dict[str, np.ndarray]
    worst: dict
    verdict: str
    threshold: float
    D: int
    n_runs: int
    prior: str | None = None      # names the directions of the m panels (``panel_label``)


def _draw_log_panel(ax: Axes, lo: LogOverlay, name: str) -> None:
    """The simulated runs (band or traces; without them the ODE ± the expected spread),
    the ODE's lines and the user's run as dark-edged markers."""
    if lo.runs is not None:
        draw_runs(ax, lo.t, lo.runs[name], f"SGD at D = {lo.D}", markers=False)
        draw_lines(ax, lo.t, lo.theory[name], "ODE")
    else:   # the band shares the line's label: one legend entry draws both
        theory, spread = lo.theory[name], lo.spread[name]
        n = theory.shape[-1]
        for j in range(n):
            draw_band(ax, lo.t, theory[:, j] - spread[:, j], theory[:, j] + spread[:, j], None,
                      series_style(j, n), series_label("ODE", j, n, SPREAD_TEXT))
        draw_lines(ax, lo.t, theory, "ODE", SPREAD_TEXT)
    draw_points(ax, lo.t, lo.data[name], "your run")
    label_axes(ax, r"$t$ = steps / $D$", panel_label(name, lo.prior), legend=False)


def _draw_verdict_panel(ax: Axes, lo: LogOverlay) -> None:
    """|z(t)| of every judged quantity (grey), the verdict's worst one (red) with its
    maximum starred, and the critical value: the picture of the verdict itself."""
    quantity = lo.worst["quantity"]
    others = [z for name, z in lo.z.items() if name != quantity]
    for i, z in enumerate(others):
        ax.plot(lo.t, np.abs(z), color="0.6", lw=0.8,
                label=f"|z| of the {len(others)} other quantities" if i == 0 else None)
    ax.plot(lo.t, np.abs(lo.z[quantity]), color="C3", lw=1.6, label=f"|z| of {quantity}")
    ax.plot([lo.worst["t_max_z"]], [lo.worst["max_abs_z"]], "*", ms=10, color="C3",
            mec="k", mew=0.5, label=f"verdict's largest |z| = {lo.worst['max_abs_z']:.2f}")
    ax.axhline(lo.threshold, color="k", ls="--", lw=1,
               label=f"critical {lo.threshold:.3g} (simulated null)")
    ax.set_ylim(0, 1.15 * max(lo.threshold, np.nanmax([lo.worst["max_abs_z"], 0.0])))
    label_axes(ax, r"$t$ = steps / $D$", r"$|z|$ (in expected spreads)",
               f"verdict: {lo.verdict}", legend=False)


def log_rank(label: str) -> int:
    """Legend groups of compare.png: the ODE, your run, SGD, the verdict's entries."""
    for rank, start in enumerate(("ODE", "your run", "SGD")):
        if label.startswith(start):
            return rank
    return 3


def log_overlay_figure(lo: LogOverlay) -> Figure:
    """``compare.png``: a panel per kind of order parameter (the error when the log has a
    loss, m along each direction, the orthogonal part), then the verdict's panel; one legend
    under the panels.  The title's worst deviation is ``lo.worst``, the verdict's record."""
    names = [p for p in PANELS if p in lo.data]
    fig, axes = new_figure(1, len(names) + 1, panel_size=(3.3, 2.6))
    for ax, name in zip(axes, names):
        _draw_log_panel(ax, lo, name)
    _draw_verdict_panel(axes[-1], lo)
    w = lo.worst
    fig.suptitle(f"Your run against the ODE from its first state and {lo.n_runs} SGD runs at "
                 f"D = {lo.D}: {lo.verdict} (largest |z| = {w['max_abs_z']:.2f} on "
                 f"{w['quantity']} at t = {w['t_max_z']:.3g}; critical {lo.threshold:.3g})",
                 fontsize=9)
    series_legend(fig, axes, max(lo.data[name].shape[-1] for name in names), log_rank)
    return fig


def write_comparison(sim_path: str | Path, ode_path: str | Path, out_prefix: str | Path,
                     title: str | None = None) -> tuple[Path, Path, Comparison]:
    """Read a simulation file and an ODE file; write ``<prefix>.png`` and ``<prefix>.json``
    (the plotted data, the deviations, both files' params)."""
    sim, ode = read_json(sim_path), read_json(ode_path)
    comp = compare(sim, ode)
    prefix = Path(out_prefix)
    png, js = prefix.with_suffix(".png"), prefix.with_suffix(".json")
    fig = comparison_figure(comp, title, panel_series(sim, True))
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.name}.tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(png)
    write_json(js, {**comp.to_dict(), "params": {"simulation": sim.get("params"),
                                                  "ode": ode.get("params")}})
    return png, js, comp
