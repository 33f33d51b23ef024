"""Fig. 1: the ODE (theory) against finite-D SGD for softmax attention.

Caption: L = 10, H = 2 heads, softmax, F = 2, flipping spike ν1 = ν2 = 2, η = 1, SGD at
D = 10^4.  Panels: loss, m along f = 1 (constant direction), m along f = 2 (flipping-sign
direction), orthogonal component diag(Q − MMᵀ).  Our choices: the ODE drift from the
deterministic engine (``expect.laplace``, error < 1e-8, adaptive rk45 steps) in the full run; the
quick run keeps scrambled Sobol points paired with their head permutations (the deterministic
engine costs ~1 s per drift at H = 2, too slow for a one-minute figure; a fixed Monte Carlo set
of affordable size shifts the plateau of m_{h1} by several 0.01 and splits the heads
spuriously), γ = 1 (larger γ slows the
escape from the unspecialised phase, because the γ² noise inflates the orthogonal part) and a
horizon long enough for the flipping direction to specialise; the ODE and every SGD run start
from the same initial overlaps drawn at D.  Simulation: exact reduced SGD (THEORY §7).
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import OverlayPlan, PlannedFigure, Setting, overlay_draw

NUMBER = 1
CAPTION = ("ODE (lines) against SGD (dots, mean ± std over runs): softmax, L = 10, H = 2, F = 2, "
           "flipping spike ν = (2, 2), η = 1, γ = 1; same initial overlaps for all.")
FULL = OverlayPlan((Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=250.0,
                            D_init=10_000),), D=10_000, runs=8, n_samples=8192, dt=1.0,
                   n_times_ode=126, n_times_sim=26, engine="laplace")
QUICK = OverlayPlan((Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=120.0,
                             D_init=300),), D=300, runs=8, n_samples=1024, dt=1.0,
                    n_times_ode=61, n_times_sim=25, engine="sobol-sym")
FIGURE = PlannedFigure(FULL, QUICK)
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    activation = data["rows"][0]["setting"]["activation"]
    return overlay_draw(data, f"Fig. 1: {activation}, L = 10, H = 2, flipping ν = (2, 2)")
