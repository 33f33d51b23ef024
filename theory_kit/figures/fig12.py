"""Fig. 12: evolution of the heads for H ∈ {2, 4, 5, 8} (softmax, flipping, F = 2, L = 4), ODE.

Caption: flipping spike ν1 = ν2 = 2, L = 4, η = 1.  Our choices: softmax (the paper's default
activation), γ = 1, T = 1500 (quick 1200), initial overlaps drawn at D = 10^4 (also in quick
mode: a smaller D starts the heads ~δ apart, which hides the plateau), drift on scrambled
Sobol points (4096 full, 1024 quick; fewer points leave head-dependent errors that split the
heads spuriously along the constant direction during the plateau), except the full run's
H = 2 panel: the deterministic ``laplace`` engine (no sampling error, adaptive rk45 steps;
it covers per-head activations up to H = 2).

What to see: for every H the heads first move together along f = 1 with m_{h2} ≈ 0 (the
unspecialised plateau, several hundred time units at L = 4), then part along f = 2 in stages.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import Setting, head_figure, head_titles, heads_draw

NUMBER = 12
HEADS = (2, 4, 5, 8)
SETTINGS = tuple(Setting("softmax", 4, H, "flipping", (2.0, 2.0), T=1500.0) for H in HEADS)
CAPTION = ("Head trajectories m_hf(t) from the ODE for H = 2, 4, 5, 8: softmax, flipping "
           "ν = (2, 2), L = 4, η = 1 (overlaps drawn at D = 10^4), γ = 1; shaded: unspecialised "
           "phase; dashed: τ_f (δ = 0.2).")
FIGURE = head_figure(SETTINGS, n_full=4096, n_quick=1024, dt_full=3.0, dt_quick=6.0,
                     T_quick=1200.0, D_quick=None, engine="sobol", full_engine="laplace")
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    return heads_draw(data, head_titles(data, "H"),
                      "Fig. 12: softmax heads, flipping ν = (2, 2), L = 4 (ODE)", columns=4)
