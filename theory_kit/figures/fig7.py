"""Fig. 7: specialisation times on the digit-detection task and their concentration.

Paper caption: numerical simulations of SGD on the MNIST detection task (App. C), H = 10
heads with softmax attention; the specialisation time τ_f in direction f is the first time
with ‖m_{:,f} − H⁻¹ Σ_h m_{h,f} 1_H‖_2 > 1; means and variances over 100 independent runs for
each point.

Our setting (see :mod:`theory_kit.figures.digits` and Fig. 5): UCI 8 × 8 digits offline (or
``--data``), ν = 10, L = 5, D = 64, the directions u_f are the leading principal components
of the preprocessed images (the task keeps F = 50 of them; τ is shown for the first
``n_directions``), H = 10, softmax, η = 1, brute-force SGD with key step γ/D = 1/64 and time
t = steps/64.  Full: 100 runs (4 batches of 25, one resumable piece each) to T = 800 with 161
records; quick: 10 runs to T = 300 with 61 records.  τ_f is interpolated linearly between
records (``analysis.specialisation_times``); runs that never cross by T are counted in the
``fraction`` specialised and left out of the mean and variance.  The x-axis is the direction
index f, ordered by decreasing data variance: the "point" of the caption is one direction.
Note the threshold 1 sits above the initial spread (≈ η √((H−1)/D) ≈ 0.37 at D = 64).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import analysis
from .digits import DigitTask
from .digitsim import DigitSetup, DigitSimPiece, data_fingerprint
from .panels import run_pieces
from .style import SMALL, label_axes, legend_below, new_figure, series_colors

NUMBER = 7
CAPTION = ("Specialisation time τ_f along the leading principal directions f of the digit "
           "images (UCI 8×8 offline, or --data): softmax, H = 10, L = 5, ν = 10, D = 64, η = 1, "
           "γ = 1, threshold ‖m_{:,f} − mean_h m_{h,f}‖ > 1; left, the head spread d_f(t) "
           "(mean over runs); middle, mean ± std of τ_f; right, variance of τ_f; 100 runs "
           "(10 quick), brute-force SGD, t = steps/64.")
THRESHOLD = 1.0
ACTIVATIONS = ("softmax",)
# runner.precompile: no ODE, so no drift kernels to compile; brute-force SGD and the MC error
# compile the sample part (runner.PART_COMPILE_SECONDS)
DRIFT_KERNELS = False
MAJORITY = 0.5  # directions where fewer runs specialised are drawn hollow


@dataclass(frozen=True)
class Plan:
    """Runs (in batches), horizon, records, step size, how many directions to report."""

    batches: int
    runs_per_batch: int
    T: float
    n_times: int
    gamma: float = 1.0
    n_directions: int = 8


FULL = Plan(batches=4, runs_per_batch=25, T=800.0, n_times=161)
QUICK = Plan(batches=1, runs_per_batch=10, T=300.0, n_times=61, n_directions=6)


@dataclass(frozen=True)
class SpreadPiece(DigitSimPiece):
    """A batch of softmax runs, summarised by τ_f per run and the head spreads d_f(t)."""

    n_directions: int = 8
    threshold: float = THRESHOLD

    def run(self, path: Path, progress: bool, dtask: DigitTask | None = None) -> dict:
        _, _, res = self.simulate(path, dtask)
        M = res.M[..., :self.n_directions]
        spread = analysis.head_spread(M)                          # (runs, times, f)
        return {"setting": self.params(), "t": res.t,
                "tau": analysis.specialisation_times(res.t, M, self.threshold),
                "spread_mean": spread.mean(axis=0), "error_mean": res.error.mean(axis=0)}


def plan(quick: bool) -> Plan:
    return QUICK if quick else FULL


def pieces(p: Plan, setup: DigitSetup, fingerprint: str) -> list[SpreadPiece]:
    # records of a batch stay in memory (no inner checkpoint): a piece is one batch
    return [SpreadPiece(setup, fingerprint, "softmax", p.gamma, p.T, p.runs_per_batch,
                        p.n_times, seed=100 + i, error_samples=32, checkpoint=False,
                        n_directions=p.n_directions) for i in range(p.batches)]


def estimate_seconds(quick: bool) -> float:
    return float(sum(pc.seconds() for pc in pieces(plan(quick), DigitSetup(), "")))


def n_pieces(quick: bool) -> int:
    """One piece per batch of runs (quick: a single batch, so one core works)."""
    return plan(quick).batches


def compute(quick: bool, workdir: Path, jobs: int = 1, data: str | None = None,
            executor: object | None = None) -> dict:
    """All batches (resumable), then τ statistics over every run."""
    p = plan(quick)
    setup = DigitSetup(data=data)
    dtask = setup.load()
    setup = replace(setup, F=dtask.F)
    n_dirs = min(p.n_directions, dtask.F)
    p = replace(p, n_directions=n_dirs)
    batches = run_pieces(pieces(p, setup, data_fingerprint(dtask)), workdir, jobs,
                         desc="fig7 batches", executor=executor, shared=dtask)
    taus = np.concatenate([np.asarray(b["tau"], dtype=float) for b in batches])
    weights = np.array([len(b["tau"]) for b in batches], dtype=float)
    spread = np.average([b["spread_mean"] for b in batches], axis=0, weights=weights)
    stats = analysis.tau_statistics(taus)
    return {"params": {**setup.params(), **vars(p), "activation": "softmax", "D": dtask.D,
                       "threshold": THRESHOLD, "runs": int(taus.shape[0]), "task": dtask.params(),
                       "explained_variance_per_direction":
                           (dtask.data.variances[:n_dirs] / dtask.data.variances.sum()).tolist()},
            "t": batches[0]["t"], "spread_mean": spread,
            "error_mean": np.average([b["error_mean"] for b in batches], axis=0, weights=weights),
            "tau": taus, "tau_stats": stats}


# ----------------------------------------------------------------------------- drawing
def draw(data: dict) -> Figure:
    p, stats = data["params"], data["tau_stats"]
    n_dirs = len(stats["mean"])
    f = np.arange(1, n_dirs + 1)
    mean, std, var = (np.asarray(stats[k], dtype=float) for k in ("mean", "std", "var"))
    frac = np.asarray(stats["fraction"], dtype=float)
    fig, (ax_s, ax_m, ax_v) = new_figure(1, 3, panel_size=(4.0, 3.8))  # legends below
    colors = series_colors(n_dirs)
    spread = np.asarray(data["spread_mean"], dtype=float)
    for k in range(n_dirs):
        ax_s.plot(data["t"], spread[:, k], color=colors[k], label=f"f = {k + 1}")
    ax_s.axhline(p["threshold"], color="k", ls="--", lw=1, label="threshold")
    label_axes(ax_s, r"$t$ = steps / D", r"$\|m_{:,f} - \bar m_f 1_H\|_2$ (mean)",
               "head spread along PC f", legend=False)
    legend_below(ax_s, ncol=4)
    # solid: most runs specialised by T; hollow: the mean over the few that did (biased low)
    most = np.isfinite(mean) & (frac >= MAJORITY)
    few = np.isfinite(mean) & (frac < MAJORITY)
    ax_m.errorbar(f[most], mean[most], yerr=std[most], fmt="o-", capsize=3, color="C0",
                  label="mean ± std")
    ax_m.plot(f[few], mean[few], "o", mfc="none", color="0.5",
              label=f"< {MAJORITY:.0%} of runs specialised")
    for i in np.flatnonzero(np.isfinite(mean) & (frac < 1)):
        ax_m.annotate(f"{frac[i]:.0%}", (f[i], mean[i]), fontsize=SMALL, xytext=(4, -10),
                      textcoords="offset points")
    label_axes(ax_m, "direction f (principal component)", r"$\tau_f$",
               f"mean over {p['runs']} runs (% = share specialised by T = {p['T']:g})")
    ax_v.plot(f[most], var[most], "s-", color="C3", label=r"Var $\tau_f$")
    ax_v.plot(f[few & np.isfinite(var)], var[few & np.isfinite(var)], "s", mfc="none",
              color="0.5", label=f"< {MAJORITY:.0%} specialised")
    ax_v.set_yscale("log")
    label_axes(ax_v, "direction f (principal component)", r"Var $\tau_f$", "variance over runs")
    for ax in (ax_m, ax_v):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"Fig. 7: digit task, softmax, H = {p['H']}, L = {p['L']}, ν = {p['nu']:g}, "
                 f"D = {p['D']}, γ = {p['gamma']:g}, threshold {p['threshold']:g}", fontsize=9)
    fig.tight_layout()
    return fig
