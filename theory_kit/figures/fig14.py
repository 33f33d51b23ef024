"""Fig. 14: the H = 8 heads for a Gaussian prior at F = 3, two initial conditions (ODE).

Caption: H = 8, non-isotropic Gaussian prior at F = 3; the two lines are two runs from
different initial conditions.  The caption gives no activation, L or ν: we use Fig. 3's
L = 5, ν = (20, 1, 1) with B-softmax — the activation of Fig. 3 whose heads specialise along
the weak directions within a horizon we can integrate (softmax takes ~4× longer, and its
escape at F = 3 is too slow to resolve reliably with the few drift points H = 8 allows);
γ = 1, initial overlaps drawn at D = 10^4 with seeds 0 and 1, T = 1500 (quick 1200), drift on
scrambled Sobol points (512 full, 128 quick).

What to see: the same unspecialised alignment with u_1 first, then a staged split along u_2
and u_3 whose order, times and head assignment depend on the initial condition.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from . import fig3
from .panels import head_figure, head_titles, heads_draw

NUMBER = 14
BASE = fig3.BASE.with_(activation="bsoftmax", T=1500.0)
SETTINGS = (BASE, BASE.with_(seed=1))
CAPTION = ("Head trajectories m_hf(t) from the ODE for two initial conditions (seeds 0, 1): "
           "B-softmax, H = 8, Gaussian prior, F = 3, L = 5, ν = (20, 1, 1), η = 1 (overlaps "
           "drawn at D = 10^4), γ = 1; dashed: τ_f (δ = 0.2).")
FIGURE = head_figure(SETTINGS, n_full=512, n_quick=128, dt_full=3.0, dt_quick=6.0,
                     T_quick=1200.0, D_quick=None, engine="sobol")
plan, estimate_seconds, compute = FIGURE.plan, FIGURE.estimate_seconds, FIGURE.compute


def draw(data: dict) -> Figure:
    titles = ["initial condition " + title for title in head_titles(data, "seed")]
    return heads_draw(data, titles, "Fig. 14: B-softmax, H = 8, Gaussian ν = (20, 1, 1), L = 5, "
                                    "two initial conditions (ODE)", columns=2)
