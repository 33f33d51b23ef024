"""Fig. 5: the digit-detection task — learned keys as images, and the achieved error E^σ_∞.

Paper caption: MNIST detection task (App. C); left: the learned keys (k_h) at H = 10; right:
the achieved error E^σ_∞ for the activation functions after training.

Our setting (offline, so not MNIST; see :mod:`theory_kit.figures.digits`): the UCI handwritten
digits (8 × 8, 1,797 images) or the user's ``--data FILE.npz``; images centred, scaled to unit
RMS norm, times √ν with ν = 10 (E|θ|² = ν); L = 5 tokens, the others pure N(0, I_64) noise;
D = 64 (the pixels), directions = the F = 50 leading principal components (99.95 % of the
variance).  H = 10 heads, η = 1, brute-force online SGD with key step γ/D, time t = steps/D.
Full: γ = 0.5, T = 4000 (256,000 steps), 4 runs per activation; quick: γ = 2, T = 100,
2 runs.  E^σ_∞ is the population error of the final keys, estimated per run by Monte Carlo
on fresh samples of the exact score law (20,000 draws; 4,000 quick).  E at T is E∞ only if
training has converged, so each run is checked: E(T) − E(3T/4), on the same draws (paired, so
its error is far below E's own), must not fall below −0.01 by more than two standard errors
(:func:`converged_runs`).  We show the mean over the converged runs ± its standard error; a
run still falling is drawn hollow and left out of the mean.  The keys shown are
Σ_f m_{hf} u_f (the part of k_h in the data span) for the first run, labelled with the class of
the nearest class-mean template and the cosine.  The middle panel (ours) is the population
error along training.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.gridspec import SubplotSpec

from ..expect.error import population_error_change_mc, population_error_mc
from ..model.state import State
from . import digits
from .digitsim import DigitSetup, DigitSimPiece, data_fingerprint
from .panels import ACT_LABELS, run_pieces
from .style import RC, SMALL, label_axes, labelled_handles, series_colors

NUMBER = 5
CAPTION = ("Digit-detection task (UCI 8×8 digits offline, or --data): left, the learned keys "
           "k_h (H = 10, their part in the data span) as images with their nearest class "
           "template and cosine; middle, population error along training; right, the achieved "
           "error E∞ per activation (MC on fresh samples): mean ± standard error over the runs "
           "that have converged, that is whose error fell by at most 0.01 over the last quarter "
           "of training (paired MC, 2σ); a run still falling is drawn hollow and left out. "
           "ν = 10, L = 5, D = 64, F = 50 principal directions, η = 1, brute-force SGD, "
           "t = steps/64; full: γ = 0.5, T = 4000, 4 runs; quick: γ = 2, T = 100, 2 runs.")
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
# runner.precompile: no ODE, so no drift kernels to compile; brute-force SGD and the MC error
# compile the sample part (runner.PART_COMPILE_SECONDS)
DRIFT_KERNELS = False


@dataclass(frozen=True)
class Plan:
    """Step size, horizon, runs per activation, records, MC draws for E∞."""

    gamma: float
    T: float
    runs: int
    n_times: int
    mc_samples: int
    error_samples: int = 256
    # The convergence check: a run has converged when E fell by at most settle_tol over the
    # last check_fraction of training (paired MC, judged at 2σ).  0.01 is a tenth of the
    # smallest gap between the activations' E∞ that the figure is about (~0.06).
    check_fraction: float = 0.25
    settle_tol: float = 0.01


FULL = Plan(gamma=0.5, T=4000.0, runs=4, n_times=41, mc_samples=20_000)
QUICK = Plan(gamma=2.0, T=100.0, runs=2, n_times=11, mc_samples=4_000)


@dataclass(frozen=True)
class KeysPiece(DigitSimPiece):
    """Training runs of one activation, summarised by E∞ per run, the key images and their
    nearest class templates."""

    mc_samples: int = 20_000
    check_fraction: float = 0.25

    def run(self, path: Path, progress: bool, dtask: digits.DigitTask | None = None) -> dict:
        dtask, cfg, res = self.simulate(path, dtask)
        act = cfg.act
        finals = [State(res.M[r, -1], res.Q[r, -1], res.a[r, -1], res.b[r, -1])
                  for r in range(self.runs)]
        errors = [population_error_mc(dtask.task, act, st, n=self.mc_samples,
                                      seed=self.seed * 1000 + r) for r, st in enumerate(finals)]
        # the first record from (1 − check_fraction)·T on: the window is at most that fraction
        k = int(np.argmax(np.asarray(res.t) >= (1 - self.check_fraction) * self.T * (1 - 1e-12)))
        # E(T) − E(t_check) on E∞'s own draws: paired, so far more precise than either
        changes = [population_error_change_mc(
            dtask.task, act, State(res.M[r, k], res.Q[r, k], res.a[r, k], res.b[r, k]), st,
            n=self.mc_samples, seed=self.seed * 1000 + r) for r, st in enumerate(finals)]
        keys = dtask.keys_to_pixels(res.M[:, -1])
        out = {"setting": self.params(), "t": res.t, "error_curves": res.error,
               "E_inf": [e.value for e in errors], "E_inf_mc_stderr": [e.abs_err for e in errors],
               "check_time": float(res.t[k]), "E_change": [c.value for c in changes],
               "E_change_stderr": [c.abs_err for c in changes],
               "key_images": keys, "key_norms": np.sqrt(np.einsum("rhh->rh", res.Q[:, -1])),
               "b": res.b[:, -1], "matches": None}
        if dtask.data.labels is not None:
            classes, templates = digits.class_templates(dtask.data)
            out["matches"] = digits.match_templates(keys, templates, classes).to_dict()
        return out


def plan(quick: bool) -> Plan:
    return QUICK if quick else FULL


def pieces(p: Plan, setup: DigitSetup, fingerprint: str) -> list[KeysPiece]:
    return [KeysPiece(setup, fingerprint, act, p.gamma, p.T, p.runs, p.n_times, seed=i + 1,
                      error_samples=p.error_samples, mc_samples=p.mc_samples,
                      check_fraction=p.check_fraction)
            for i, act in enumerate(ACTIVATIONS)]


def estimate_seconds(quick: bool) -> float:
    return float(sum(pc.seconds() for pc in pieces(plan(quick), DigitSetup(), "")))


def n_pieces(quick: bool) -> int:
    """One piece per activation (they run in parallel up to --jobs)."""
    return len(pieces(plan(quick), DigitSetup(), ""))


def converged_runs(piece: dict, settle_tol: float) -> list[bool]:
    """Which runs have converged: E fell by at most ``settle_tol`` from ``check_time`` to T,
    judged at two paired standard errors (a run is left out only when it is shown to be still
    falling).

    >>> converged_runs({"E_change": [-0.002, -0.03, -0.011], "E_change_stderr": [0.001] * 3}, 0.01)
    [True, False, True]
    """
    return [bool(-c - 2 * se <= settle_tol)
            for c, se in zip(piece["E_change"], piece["E_change_stderr"])]


def summarise(piece: dict, settle_tol: float) -> dict:
    """Which runs have converged (:func:`converged_runs`), the mean over those of E∞ with its
    standard error (the run-to-run spread, which contains each run's MC error; the run's own
    MC error when one run is left; None when none is), and the mean error curve."""
    ok = converged_runs(piece, settle_tol)
    E = np.asarray(piece["E_inf"], dtype=float)[ok]
    mean: float | None = float(E.mean()) if E.size else None
    sem: float | None = None
    if E.size > 1:
        sem = float(E.std(ddof=1) / np.sqrt(E.size))
    elif E.size == 1:
        sem = float(np.asarray(piece["E_inf_mc_stderr"], dtype=float)[ok][0])
    act = piece["setting"]["activation"]
    return {**piece, "label": ACT_LABELS.get(act, act), "converged": ok, "E_inf_mean": mean,
            "E_inf_sem": sem, "error_curve_mean": np.mean(piece["error_curves"], axis=0)}


def compute(quick: bool, workdir: Path, jobs: int = 1, data: str | None = None,
            executor: object | None = None) -> dict:
    """Train every activation (one resumable piece each) and collect E∞, keys, matches."""
    p = plan(quick)
    setup = DigitSetup(data=data)
    dtask = setup.load()
    setup = replace(setup, F=dtask.F)
    rows = run_pieces(pieces(p, setup, data_fingerprint(dtask)), workdir, jobs,
                      desc="fig5 activations", executor=executor, shared=dtask)
    baseline = None
    templates: dict[str, np.ndarray] | None = None
    if dtask.data.labels is not None:
        classes, images = digits.class_templates(dtask.data)
        baseline = digits.random_key_baseline(images, dtask.basis)
        templates = {"classes": classes, "images": images}
    return {"params": {**setup.params(), **vars(p), "D": dtask.D, "task": dtask.params(),
                       "activations": list(ACTIVATIONS),
                       "error_estimate": "Monte Carlo on fresh samples of the exact score law "
                                         "given the final (M, Q, a, b); mean over the converged "
                                         "runs ± s.e.",
                       "convergence_check": "E(T) − E(check_time) on E∞'s draws (paired MC); "
                                            "converged when −change − 2 s.e. <= settle_tol"},
            "image_shape": list(dtask.data.image_shape), "chance_error": 1.0 - 1.0 / setup.L,
            "random_baseline_cosine": baseline, "templates": templates,
            "rows": [summarise(r, p.settle_tol) for r in rows]}


# ----------------------------------------------------------------------------- drawing
def _image(ax: plt.Axes, pixels: np.ndarray, shape: tuple[int, ...], title: str | None) -> None:
    lim = float(np.max(np.abs(pixels))) or 1.0
    ax.imshow(pixels.reshape(shape), cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    if title is not None:
        ax.set_title(title, fontsize=SMALL, pad=2)


def _draw_keys(fig: Figure, spec: SubplotSpec, data: dict) -> None:
    """One row of key images per activation (first run), then the class templates."""
    rows, H = data["rows"], len(data["rows"][0]["key_images"][0])
    templates = data.get("templates")
    n_templates = 0 if templates is None else len(templates["classes"])
    grid = spec.subgridspec(len(rows) + (templates is not None), max(H, n_templates),
                            wspace=0.08, hspace=0.45)
    shape = tuple(data["image_shape"])
    for r, row in enumerate(rows):
        keys = np.asarray(row["key_images"][0], dtype=float)
        for h in range(H):
            ax = fig.add_subplot(grid[r, h])
            match = row["matches"]
            _image(ax, keys[h], shape, None if match is None else
                   f"{match['classes'][0][h]} ({match['cosines'][0][h]:.2f})")
            if h == 0:
                ax.set_ylabel(row["label"], fontsize=SMALL)
    for c in range(n_templates):
        assert templates is not None   # n_templates is 0 without templates
        ax = fig.add_subplot(grid[len(rows), c])
        _image(ax, np.asarray(templates["images"][c], dtype=float), shape,
               f"class {templates['classes'][c]}")
        if c == 0:
            ax.set_ylabel("templates", fontsize=SMALL)


CHANCE_LABEL = "keys = 0: 1 − 1/L"


def _draw_curves(ax: plt.Axes, data: dict) -> None:
    for row, color in zip(data["rows"], series_colors(len(data["rows"]))):
        ax.plot(row["t"], row["error_curve_mean"], color=color, label=row["label"])
    ax.axhline(data["chance_error"], color="0.5", ls=":", lw=1, label=CHANCE_LABEL)
    label_axes(ax, r"$t$ = steps / D", "population error", "training", legend=False)


def _draw_einf(ax: plt.Axes, data: dict) -> None:
    """E∞ per activation: a bar at the mean over the converged runs (the activation's colour
    and label, so the figure's legend names bar and curve together), its standard error,
    every run (hollow: not converged, left out of the mean)."""
    rows = data["rows"]
    x = np.arange(len(rows))
    # repeated labels are fine: the figure's legend names each label once (labelled_handles)
    for i, (row, color) in enumerate(zip(rows, series_colors(len(rows)))):
        ok = np.asarray(row.get("converged", [True] * len(row["E_inf"])), dtype=bool)
        runs = np.asarray(row["E_inf"], dtype=float)
        if ok.any():
            ax.plot(np.full(ok.sum(), x[i]), runs[ok], "k.", ms=4, label="each run")
        if not ok.all():
            ax.plot(np.full((~ok).sum(), x[i]), runs[~ok], "o", ms=4, color="k", mfc="none",
                    label="not converged (left out)")
        mean, sem = row["E_inf_mean"], row["E_inf_sem"]
        if mean is None:
            ax.annotate("no run\nconverged", (x[i], float(runs.max())), ha="center",
                        va="bottom", fontsize=SMALL, xytext=(0, 6), textcoords="offset points")
            continue
        ax.bar(x[i], mean, color=color, alpha=0.6, label=row["label"])
        ax.errorbar([x[i]], [mean], yerr=[sem], fmt="none", ecolor="k", capsize=4,
                    label="mean ± s.e.m. over converged runs")
        ax.annotate(f"{mean:.3f}", (x[i], mean + sem), ha="center",
                    va="bottom", fontsize=SMALL, xytext=(0, 6), textcoords="offset points")
    ax.axhline(data["chance_error"], color="0.5", ls=":", lw=1, label=CHANCE_LABEL)
    ax.set_xticks(x, [r["label"] for r in rows], fontsize=SMALL)
    ax.set_xlim(-0.6, len(rows) - 0.4)    # room for every activation, with a bar or without
    lo = min(min(r["E_inf"]) for r in rows)
    ax.set_ylim(max(0.0, lo - 0.1), data["chance_error"] + 0.05)
    label_axes(ax, "activation", r"$E^\sigma_\infty$", "achieved error", legend=False)


def _legend_under(fig: Figure, axes: list[plt.Axes]) -> None:
    """One legend for the two right panels, centred under them (the key images need none)."""
    handles, labels = labelled_handles(axes)
    left, right = axes[0].get_position().x0, axes[-1].get_position().x1
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5 * (left + right), 0.01),
               ncol=3, fontsize=SMALL, frameon=False)


def draw(data: dict) -> Figure:
    with plt.rc_context(RC):
        fig = plt.figure(figsize=(15.0, 5.2))
        outer = fig.add_gridspec(1, 3, width_ratios=[3.0, 1.15, 1.0], wspace=0.28, left=0.03,
                                 right=0.99, bottom=0.24, top=0.84)  # room for the legend below
        _draw_keys(fig, outer[0], data)
        curves, einf = fig.add_subplot(outer[1]), fig.add_subplot(outer[2])
        _draw_curves(curves, data)
        _draw_einf(einf, data)
        _legend_under(fig, [curves, einf])
        p = data["params"]
        base = data.get("random_baseline_cosine")
        extra = f"; random keys: mean max-cosine {base:.2f}" if base is not None else ""
        fig.suptitle(f"Fig. 5: digit detection, H = {p['H']}, L = {p['L']}, ν = {p['nu']:g}, "
                     f"D = {p['D']}, γ = {p['gamma']:g}, T = {p['T']:g}, {p['runs']} runs; keys "
                     f"(run 1) titled by nearest class template (cosine){extra}", fontsize=SMALL)
    return fig
