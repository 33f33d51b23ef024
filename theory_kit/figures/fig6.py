"""Fig. 6: the specialisation time concentrates as D grows (reduced SGD simulations).

Caption: L = 5, H = 2, softmax, F = 2, flipping spike ν1 = ν2 = 2, δ = 0.2; means and variances
over 100 independent runs per D.  Our choices: γ = 1, η = 1, each run draws its own initial
keys k_h(0) ~ N(0, I/D) (so both the initial symmetry breaking and the SGD noise scale as
1/√D); τ_2 = first t with ‖m_{:,2} − mean_h m_{h,2}‖ > δ, interpolated between records
every 2 time units.  Also shown: τ_2 / ln D, since an escape from the unspecialised fixed
point starting at ~1/√D takes a time growing like ln D.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .. import analysis
from .panels import Setting, SimPiece, pieces_seconds, run_pieces
from .style import label_axes, new_figure

NUMBER = 6
DELTA = 0.2
SETTING = Setting("softmax", 5, 2, "flipping", (2.0, 2.0), gamma=1.0, eta=1.0)
CAPTION = ("Mean and variance of the specialisation time τ_2 (δ = 0.2) over independent SGD runs "
           "against D: softmax, L = 5, H = 2, flipping ν = (2, 2), η = 1, γ = 1.")


def pieces(quick: bool) -> list[SimPiece]:
    D_values, runs, T = ((50, 100, 200), 20, 300.0) if quick else ((50, 100, 200, 400, 800),
                                                                 100, 400.0)
    return [SimPiece(SETTING.with_(T=T, D_init=D), D, runs, n_times=int(T / 2) + 1,
                     sim_seed=10 + D, shared_start=False) for D in D_values]


def estimate_seconds(quick: bool) -> float:
    return pieces_seconds(pieces(quick))


def compute(quick: bool, workdir: Path, jobs: int = 1) -> dict:
    plan = pieces(quick)
    results = run_pieces(plan, workdir, jobs, desc="SGD runs per D")
    taus = [analysis.specialisation_times(r["t"], r["M"], DELTA)[:, 1] for r in results]
    D = np.array([p.D for p in plan])
    stats = analysis.concentration(D, taus, DELTA)
    return {"params": {"setting": SETTING.params(), "D": D, "runs": plan[0].runs,
                       "T": plan[0].setting.T, "delta": DELTA, "simulation": "reduced",
                       "record_every": 2.0},
            "tau": taus, **{k: stats[k] for k in ("mean", "var", "std", "median", "fraction")}}


def draw(data: dict) -> Figure:
    D = np.asarray(data["params"]["D"], dtype=float)
    mean, var = np.asarray(data["mean"], float), np.asarray(data["var"], float)
    fig, (ax_tau, ax_var, ax_scaled) = new_figure(1, 3, panel_size=(3.2, 2.7))
    for d, taus in zip(D, data["tau"]):
        taus = np.asarray(taus, float)
        ax_tau.plot(np.full(taus.shape, d), taus, "o", ms=2, color="0.6", alpha=0.4)
    ax_tau.errorbar(D, mean, yerr=np.sqrt(var), fmt="o-", color="C0", capsize=2,
                    label="mean ± std")
    ax_tau.plot([], [], "o", ms=2, color="0.6", label="each run")
    ax_tau.set_xscale("log")
    label_axes(ax_tau, r"$D$", r"$\tau_2$", f"{data['params']['runs']} runs per D")
    ax_var.loglog(D, var, "s-", color="C1", label=r"Var $\tau_2$")
    ax_var.loglog(D, var / mean ** 2, "^-", color="C2", label=r"Var $\tau_2$ / $\langle\tau_2\rangle^2$")
    label_axes(ax_var, r"$D$", "variance", rf"$\delta$ = {data['params']['delta']}")
    scaled = [np.asarray(t, float) / np.log(d) for d, t in zip(D, data["tau"])]
    ax_scaled.errorbar(D, [np.mean(s[np.isfinite(s)]) for s in scaled],
                       yerr=[np.std(s[np.isfinite(s)], ddof=1) for s in scaled], fmt="o-",
                       color="C3", capsize=2, label=r"$\tau_2/\ln D$")
    ax_scaled.set_xscale("log")
    label_axes(ax_scaled, r"$D$", r"$\tau_2 / \ln D$", "specialised fraction: " +
               ", ".join(f"{f:.2f}" for f in np.asarray(data["fraction"], float)))
    fig.suptitle("Fig. 6: concentration of the specialisation time (softmax, L = 5, H = 2, "
                 "flipping ν = (2, 2))", fontsize=9)
    fig.tight_layout()
    return fig
