"""Fig. 2: evolution of the heads (softmax, F = 2, L = 4, η = 1), ODE.

Caption: left flipping spike ν1 = ν2 = 2, right non-isotropic Gaussian ν1 = 8, ν2 = 2.  The
caption does not give H; we use H = 4.  Our choices: γ = 1, initial overlaps drawn at
D = 10^4 (so the heads start ~1/√D apart, as in the paper's SGD), horizon T = 1500, drift
expectations on scrambled Sobol points (a fixed Monte Carlo set of the same cost leaves errors
that differ between heads and split them spuriously during the long plateau).  Each group
shows m_{hf}(t) for every head along f = 1 (top) and f = 2 (bottom), with the specialisation
time τ_f (δ = 0.2) dashed.

What to see: flipping — all heads grow together along the constant direction f = 1 and stay
together along f = 2 for hundreds of time units (the unspecialised plateau), then they part
along f = 2, in stages (first two heads of opposite sign, the others later).  Gaussian — the
heads first leave m = 0 along the strong direction f = 1 with random signs (τ_1 ≈ 20), then,
much later, part along the weak direction f = 2.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import Setting, head_figure, head_titles, heads_draw

NUMBER = 2
SETTINGS = (Setting("softmax", 4, 4, "flipping", (2.0, 2.0), T=1500.0),
            Setting("softmax", 4, 4, "gaussian", (8.0, 2.0), T=1500.0))
CAPTION = ("Head trajectories m_hf(t) from the ODE: softmax, H = 4, L = 4, η = 1 (overlaps drawn "
           "at D = 10^4), γ = 1; left flipping ν = (2, 2), right Gaussian ν = (8, 2); dashed: "
           "τ_f (δ = 0.2).")
FIGURE = head_figure(SETTINGS, n_full=4096, n_quick=1024, dt_full=2.5, dt_quick=5.0,
                     T_quick=1200.0, D_quick=None, engine="sobol")
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    return heads_draw(data, head_titles(data, "prior", "nu", "H"),
                      "Fig. 2: softmax heads, L = 4 (ODE)", columns=2)
