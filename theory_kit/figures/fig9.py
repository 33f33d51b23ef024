"""Fig. 9: ODE against SGD for softmax, softmax-1 and B-softmax (L = 5, H = 2, flipping).

Caption: L = 5, H = 2, F = 2, flipping spike ν1 = ν2 = 2, η = 1, SGD at D = 10^4; rows
softmax, softmax-1, B-softmax.  Our choices: γ = 1, horizon T = 150 (softmax-1 and B-softmax
specialise along the flipping direction around t ≈ 60–75; softmax, whose escape is much
slower at L = 5, is still unspecialised there), same initial overlaps for ODE and SGD.  ODE
drift: the deterministic ``laplace`` engine with adaptive rk45 steps (full run; all three
activations are within its class at H = 2), 512 scrambled Sobol points (quick, for its time
budget).
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import Setting, activation_rows_figure, overlay_draw

NUMBER = 9
BASE = Setting("softmax", 5, 2, "flipping", (2.0, 2.0), gamma=1.0, eta=1.0)
CAPTION = ("ODE (lines; one style per head) against SGD (markers, one shape per "
           "head): L = 5, H = 2, F = 2, flipping ν = (2, 2), η = 1, "
           "γ = 1; rows softmax, softmax-1, B-softmax.")
FIGURE = activation_rows_figure(BASE, T_full=150.0, T_quick=80.0, n_quick=512, engine="sobol",
                                full_engine="laplace")
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    return overlay_draw(data, "Fig. 9: L = 5, H = 2, flipping ν = (2, 2)")
