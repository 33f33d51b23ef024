"""Fig. 10: ODE against SGD for softmax, softmax-1 and B-softmax (L = 5, H = 4, Gaussian).

Caption: L = 5, H = 4, F = 2, non-isotropic Gaussian prior ν1 = 8, ν2 = 2, η = 1, SGD at
D = 10^4; rows softmax, softmax-1, B-softmax.  Our choices: γ = 1, horizon T = 150, same
initial overlaps for ODE and SGD.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import Setting, activation_rows_figure, overlay_draw

NUMBER = 10
BASE = Setting("softmax", 5, 4, "gaussian", (8.0, 2.0), gamma=1.0, eta=1.0)
CAPTION = ("ODE (lines; one style per head) against SGD (markers, one shape per "
           "head): L = 5, H = 4, F = 2, Gaussian ν = (8, 2), η = 1, "
           "γ = 1; rows softmax, softmax-1, B-softmax.")
FIGURE = activation_rows_figure(BASE, T_full=150.0, T_quick=60.0, n_full=1024, n_quick=256,
                                engine="sobol")
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    return overlay_draw(data, "Fig. 10: L = 5, H = 4, Gaussian ν = (8, 2)")
