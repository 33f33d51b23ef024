"""Fig. 6: the specialisation time concentrates as D grows (reduced SGD simulations).

Caption: L = 5, H = 2, softmax, F = 2, flipping spike ν1 = ν2 = 2, δ = 0.2; means and variances
over 100 independent runs per D.  Our choices: γ = 1, η = 1, each run draws its own initial
keys k_h(0) ~ N(0, I/D) at its D; τ_2 = first t with ‖m_{:,2} − mean_h m_{h,2}‖ > δ,
interpolated between records every 5 time units.

What concentrates is the *relative* spread.  The heads leave the unspecialised fixed point
from an asymmetry ξ/√D (initial draw plus SGD noise, ξ = O(1) random), so
τ_2 ≈ c + ln(δ√D/|ξ|)/λ: the mean grows like ln D while the spread, set by ln|ξ|, stays of
order 1/λ.  Hence std τ_2 / ⟨τ_2⟩ (and Var τ_2 / ⟨τ_2⟩²) falls like 1/ln D, whereas Var τ_2
itself need not fall.  D starts at 250: below that a run can start with spread ≥ δ
(probability 2Φ(−δ√D), 4.6 % at D = 100), which puts τ_2 = 0 and hides the law above.
Runs that have not crossed by T stay in the data as τ_2 = inf; statistics use the runs
that crossed and the figure reports the crossed fraction.
Theory (orange): the law of τ_2 predicted by ``theory_kit.dynamics.escape`` at each D
(linearised escape from the head-symmetric plateau, initial-overlap and SGD fluctuations; 2000
samples of the linear process per D; drift on the deterministic ``laplace`` engine, so λ(t)
has no sampling error: 8192 Sobol points, used before, put λ 1.7 % low at t = 200; quick: 1024
Sobol points paired with the head swap, a smoke test).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, FuncFormatter, NullLocator

from .. import analysis
from .escape_pieces import EscapePiece, draw_band_over_d, predicted
from .panels import Setting, SimPiece, pieces_seconds, run_pieces
from .style import label_axes, new_figure

NUMBER = 6
DELTA = 0.2
RECORD_EVERY = 5.0          # records (and checkpoints, whose cost grows with their number)
BOOTSTRAP = 2000            # resamples of the runs for the standard errors of Var and std/mean
SETTING = Setting("softmax", 5, 2, "flipping", (2.0, 2.0), gamma=1.0, eta=1.0)
FULL = {"D": (250, 500, 1000, 2000, 4000), "runs": 100, "T": 400.0}
QUICK = {"D": (250, 1000), "runs": 24, "T": 300.0}
THEORY_POINTS = {"quick": 1024}   # Sobol points of the quick escape theory's drift
CAPTION = ("Concentration of the specialisation time τ_2 (δ = 0.2) of SGD against D: softmax, "
           "L = 5, H = 2, F = 2, flipping ν = (2, 2), γ = 1, η = 1, each run from its own "
           "initial keys drawn at D; full: D = 250..4000, 100 runs per D, T = 400. "
           "Mean ± std, Var τ_2 and std/mean (bootstrap errors).")


def plan(quick: bool) -> dict:
    """D values, runs per D and horizon of the full or quick figure."""
    return QUICK if quick else FULL


def pieces(quick: bool) -> list[SimPiece]:
    """One batch of independent runs per D, largest D first (with --jobs 2 the costliest
    piece starts at once and the others fill the second worker)."""
    p = plan(quick)
    return [SimPiece(SETTING.with_(T=p["T"], D_init=D), D, p["runs"],
                     n_times=int(p["T"] / RECORD_EVERY) + 1, sim_seed=10 + D, shared_start=False)
            for D in sorted(p["D"], reverse=True)]


def theory_piece(quick: bool) -> EscapePiece:
    """The predicted law of τ_2 at the same D (``theory_kit.dynamics.escape``: linearised
    escape from the head-symmetric plateau plus the initial-overlap and SGD fluctuations)."""
    p = plan(quick)
    return EscapePiece(SETTING.with_(T=p["T"]), tuple(sorted(p["D"])),
                       points=THEORY_POINTS["quick"], engine="sobol" if quick else "laplace")


def estimate_seconds(quick: bool) -> float:
    return pieces_seconds(pieces(quick)) + theory_piece(quick).seconds()


def relative_spread(taus: np.ndarray) -> float:
    """std/mean of the finite τ (ddof = 1); NaN with fewer than two, or a mean of 0 (every
    run specialised at t = 0: no spread to speak of)."""
    ok = taus[np.isfinite(taus)]
    if ok.size < 2 or np.mean(ok) == 0:
        return float("nan")
    return float(np.std(ok, ddof=1) / np.mean(ok))


def variance(taus: np.ndarray) -> float:
    """Var of the finite τ (ddof = 1); NaN with fewer than two."""
    ok = taus[np.isfinite(taus)]
    return float(np.var(ok, ddof=1)) if ok.size > 1 else float("nan")


def quantile_spread(taus: np.ndarray) -> float:
    """(q90 − q10)/median over all runs, the ones that never crossed counted as τ = inf:
    unlike std/mean it is not biased by the censoring at T, and it is NaN when more than
    10 % of the runs did not cross (then q90 is unknown)."""
    q10, q50, q90 = np.quantile(taus, [0.1, 0.5, 0.9], method="inverted_cdf")
    return float((q90 - q10) / q50) if np.isfinite(q90) else float("nan")


def bootstrap_se(taus: np.ndarray, statistic: Callable[[np.ndarray], float],
                 n: int = BOOTSTRAP, seed: int = 0) -> float:
    """Standard error of ``statistic(τ)`` by resampling the runs with replacement (censored
    runs stay in the resamples as inf, as in the data)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, taus.size, size=(n, taus.size))
    values = np.array([statistic(taus[idx]) for idx in picks])
    ok = values[~np.isnan(values)]
    # NaN (without numpy's ddof warning) when fewer than two resamples have the statistic
    return float(np.std(ok, ddof=1)) if ok.size > 1 else float("nan")


def summary(D: np.ndarray, taus: list[np.ndarray], t0: float) -> dict:
    """Per D: mean, var, std, median, q10, q90, crossed fraction (analysis.concentration),
    std/mean and the bootstrap standard errors of Var and std/mean, and the share of runs
    that started with spread ≥ δ (τ_2 = t0)."""
    stats = analysis.concentration(D, taus, DELTA)
    out = {k: stats[k] for k in ("mean", "var", "std", "median", "q10", "q90", "fraction")}
    out["rel_std"] = np.array([relative_spread(t) for t in taus])
    out["rel_std_se"] = np.array([bootstrap_se(t, relative_spread) for t in taus])
    out["var_se"] = np.array([bootstrap_se(t, variance) for t in taus])
    out["started_above"] = np.array([float(np.mean(t == t0)) for t in taus])
    out["rel_quantile"] = np.array([quantile_spread(t) for t in taus])
    return out


def compute(quick: bool, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
    work = pieces(quick)
    results = run_pieces(work + [theory_piece(quick)], workdir, jobs,
                         desc="SGD runs per D + theory", executor=executor)
    theory = results.pop()
    order = np.argsort([p.D for p in work])
    D = np.array([work[i].D for i in order])
    taus = [analysis.specialisation_times(results[i]["t"], results[i]["M"], DELTA)[:, 1]
            for i in order]
    p = plan(quick)
    return {"params": {"setting": SETTING.params(), "D": D, "runs": p["runs"], "T": p["T"],
                       "delta": DELTA, "simulation": "reduced", "record_every": RECORD_EVERY,
                       "initial": "own draw per run at D, k_h ~ N(0, eta^2 I/D)",
                       "sim_seeds": [work[i].sim_seed for i in order],
                       "bootstrap_resamples": BOOTSTRAP, "statistics": "over runs that crossed"},
            "tau": taus, **summary(D, taus, 0.0), "theory": theory}


def _log_fit(D: np.ndarray, mean: np.ndarray, std: np.ndarray, runs: int) -> np.ndarray:
    """(a, b) of ⟨τ⟩ ≈ a + b ln D, weighted by the standard errors of the means."""
    w = np.sqrt(runs) / std
    return np.polyfit(np.log(D), mean, 1, w=w)[::-1]


def _log_d_axis(ax: Axes, D: np.ndarray) -> None:
    """Logarithmic D axis with a plain tick at every simulated D."""
    ax.set_xscale("log")
    ax.set_xticks(D, [f"{d:g}" for d in D])
    ax.xaxis.set_minor_locator(NullLocator())


def _plain_log_y(ax: Axes) -> None:
    """Logarithmic y axis labelled with plain numbers (0.3, 0.5, ...) instead of 3×10⁻¹."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda y, _: f"{y:g}" if round(y / 10 ** np.floor(np.log10(y))) in (2, 3, 5) else ""))


def _draw_runs(ax: Axes, data: dict) -> None:
    """Every run's τ_2 (grey, spread sideways), censored runs as triangles at T, mean ± std and
    the fit a + b ln D."""
    params = data["params"]
    D = np.asarray(params["D"], dtype=float)
    mean, std = np.asarray(data["mean"], float), np.asarray(data["std"], float)
    jitter = np.random.default_rng(0)
    for d, taus in zip(D, data["tau"]):
        taus = np.asarray(taus, float)
        spread_x = d * np.exp(0.06 * jitter.standard_normal(taus.size))  # runs side by side
        crossed = np.isfinite(taus)
        ax.plot(spread_x[crossed], taus[crossed], "o", ms=2, color="0.6", alpha=0.35)
        ax.plot(spread_x[~crossed], np.full((~crossed).sum(), params["T"]), "^", ms=3.5,
                color="C3", alpha=0.7)
    ax.plot([], [], "o", ms=2, color="0.6", label="each run")
    ax.plot([], [], "^", ms=3.5, color="C3", label="not crossed by T")
    ax.errorbar(D, mean, yerr=std, fmt="o", color="C0", capsize=3,
                label=r"$\langle\tau_2\rangle \pm$ std")
    a, b = _log_fit(D, mean, std, int(params["runs"]))
    grid = np.geomspace(D[0], D[-1], 50)
    ax.plot(grid, a + b * np.log(grid), "--", color="C0", lw=1,
            label=rf"fit ${a:.0f} + {b:.0f}\,\ln D$")
    if data.get("theory") is not None:
        draw_band_over_d(ax, data["theory"])
    _log_d_axis(ax, D)
    ax.set_ylim(0, 1.1 * params["T"])
    label_axes(ax, r"$D$", r"$\tau_2$", f"{params['runs']} runs per D, T = {params['T']:g}")


def draw(data: dict) -> Figure:
    params = data["params"]
    D = np.asarray(params["D"], dtype=float)
    var, var_se = np.asarray(data["var"], float), np.asarray(data["var_se"], float)
    rel, rel_se = np.asarray(data["rel_std"], float), np.asarray(data["rel_std_se"], float)
    fraction = np.asarray(data["fraction"], float)
    fig, (ax_tau, ax_var, ax_rel) = new_figure(1, 3, panel_size=(3.4, 4.3))  # legends below
    _draw_runs(ax_tau, data)

    ax_var.errorbar(D, var, yerr=var_se, fmt="s-", color="C1", capsize=3,
                    label=r"Var $\tau_2$ (± bootstrap s.e.)")
    theory = data.get("theory")
    if theory is not None:
        ax_var.plot(D, predicted(theory, "std") ** 2, "-.", color="0.2", lw=1.2,
                    label=r"theory Var $\tau_2$")
    ax_var.set_yscale("log")
    _log_d_axis(ax_var, D)
    label_axes(ax_var, r"$D$", r"Var $\tau_2$", rf"$\delta$ = {params['delta']}")

    ax_rel.errorbar(D, rel, yerr=rel_se, fmt="^-", color="C2", capsize=3,
                    label=r"std $\tau_2$ / $\langle\tau_2\rangle$")
    ax_rel.errorbar(D, rel ** 2, yerr=2 * rel * rel_se, fmt="v--", color="C3", capsize=3,
                    label=r"Var $\tau_2$ / $\langle\tau_2\rangle^2$")
    ax_rel.plot(D, np.asarray(data["rel_quantile"], float), "D:", color="C4", ms=4,
                label=r"$(q_{90} - q_{10})$ / median")
    if theory is not None:
        ax_rel.plot(D, predicted(theory, "std") / predicted(theory), "-.", color="0.2", lw=1.2,
                    label="theory std/mean")
    _plain_log_y(ax_rel)
    _log_d_axis(ax_rel, D)
    label_axes(ax_rel, r"$D$", "relative spread of $\\tau_2$", "crossed by T: " +
               ", ".join(f"{f:.2f}" for f in fraction))
    fig.suptitle("Fig. 6: concentration of the specialisation time (SGD, softmax, L = 5, H = 2, "
                 "F = 2, flipping ν = (2, 2))", fontsize=9)
    fig.tight_layout()
    return fig
