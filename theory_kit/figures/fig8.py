"""Fig. 8: fresh against fixed Monte Carlo samples in the ODE.

Caption: histogram of the differences between the magnetisations of the first head when the
ODE is integrated with new Monte Carlo samples at every step and with the same samples at
every step; flipping spike, H = 2, F = 2, ν1 = ν2 = 2, L = 8.  Our choices: softmax, γ = 1,
η = 1 (initial overlaps drawn at D = 10^4), RK4; each pair (fresh, fixed) uses the same seed
for its first sample set; the histogram pools all recorded times and several pairs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, cast

import numpy as np
from matplotlib.figure import Figure

from .panels import QUICK_ERROR_SAMPLES, OdePiece, Setting, pieces_seconds, run_pieces
from .style import label_axes, new_figure, series_colors

NUMBER = 8
SETTING = Setting("softmax", 8, 2, "flipping", (2.0, 2.0), gamma=1.0)
CAPTION = ("Histogram of m_1f(fresh MC samples) − m_1f(fixed MC samples) along the ODE, pooled "
           "over times and seed pairs: softmax, H = 2, F = 2, flipping ν = (2, 2), L = 8, γ = 1.")


def pieces(quick: bool) -> list[OdePiece]:
    setting = SETTING.with_(T=30.0 if quick else 60.0)
    n, dt, pairs = (300, 1.0, 2) if quick else (2000, 0.5, 3)
    # the figure shows m only: the error curve of each piece needs no more than a rough value
    return [OdePiece(setting, n, dt, n_times=31 if quick else 61, mc_seed=seed, fresh=fresh,
                     error_samples=QUICK_ERROR_SAMPLES)
            for seed in range(pairs) for fresh in (False, True)]


def estimate_seconds(quick: bool) -> float:
    return pieces_seconds(pieces(quick))


def compute(quick: bool, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
    plan = pieces(quick)
    results = run_pieces(plan, workdir, jobs, desc="ODE fixed/fresh", executor=executor)
    diffs = np.stack([np.asarray(fresh["M"])[:, 0, :] - np.asarray(fixed["M"])[:, 0, :]
                      for fixed, fresh in zip(results[::2], results[1::2])])  # pairs × t × F
    pooled = diffs[:, 1:, :].reshape(-1, diffs.shape[-1])    # t = 0 is identical by design
    return {"params": {"setting": plan[0].setting.params(), "n_samples": plan[0].n_samples,
                       "dt": plan[0].dt, "pairs": len(plan) // 2, "ode_method": "rk4"},
            "t": results[0]["t"], "differences": diffs, "mean": pooled.mean(axis=0),
            "std": pooled.std(axis=0, ddof=1), "max_abs": np.abs(pooled).max(axis=0),
            "m_scale": np.abs(np.asarray(results[0]["M"])[-1, 0, :])}


def draw(data: dict) -> Figure:
    diffs = np.asarray(data["differences"])
    pooled = diffs[:, 1:, :].reshape(-1, diffs.shape[-1])
    fig, (ax_hist, ax_time) = new_figure(1, 2, panel_size=(3.8, 3.4))  # legends below
    colors = series_colors(pooled.shape[1])
    # an array of edges is a sequence to hist (its stub only names Sequence[float])
    edges = cast(Sequence[float], np.linspace(pooled.min(), pooled.max(), 31))
    for f in range(pooled.shape[1]):
        ax_hist.hist(pooled[:, f], bins=edges, alpha=0.55, color=colors[f],
                     label=rf"$f = {f + 1}$: mean {data['mean'][f]:.1e}, std {data['std'][f]:.1e}")
    label_axes(ax_hist, r"$m_{1f}^{\rm fresh} - m_{1f}^{\rm fixed}$", "count",
               f"{data['params']['n_samples']} samples per evaluation")
    t = np.asarray(data["t"])
    for p, pair in enumerate(diffs):
        for f in range(pair.shape[1]):
            ax_time.plot(t, pair[:, f], color=colors[f], alpha=0.8,
                         label=rf"$f = {f + 1}$" if p == 0 else None)
    label_axes(ax_time, r"$t$", r"$m_{1f}^{\rm fresh} - m_{1f}^{\rm fixed}$",
               f"{data['params']['pairs']} seed pairs")
    fig.suptitle("Fig. 8: fresh against fixed Monte Carlo samples in the ODE (H = 2, L = 8, "
                 "flipping ν = (2, 2))", fontsize=9)
    fig.tight_layout()
    return fig
