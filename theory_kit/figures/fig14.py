"""Fig. 14: the H = 8 heads for a Gaussian prior at F = 3, two initial conditions (ODE).

Caption: H = 8, non-isotropic Gaussian prior at F = 3; the two lines are two runs from
different initial conditions.  The caption gives no L or ν: we use Fig. 3's (L = 5,
ν = (20, 1, 1)) with softmax, γ = 1, T = 200, initial overlaps drawn at D = 10^4 with seeds
0 and 1.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from . import fig3
from .panels import HeadsPlan, head_plan, head_title, heads_compute, heads_draw

NUMBER = 14
SETTINGS = (fig3.BASE, fig3.BASE.with_(seed=1))
CAPTION = ("Head trajectories m_hf(t) from the ODE for two initial conditions (seeds 0, 1): "
           "softmax, H = 8, Gaussian prior, F = 3, L = 5, ν = (20, 1, 1), η = 1, γ = 1.")


def plan(quick: bool) -> HeadsPlan:
    return head_plan(SETTINGS, quick, n_full=250, n_quick=50, dt_full=2.0, dt_quick=2.5,
                     T_quick=100.0)


def estimate_seconds(quick: bool) -> float:
    return plan(quick).seconds()


def compute(quick: bool, workdir: Path, jobs: int = 1) -> dict:
    return heads_compute(plan(quick), workdir, jobs)


def draw(data: dict) -> Figure:
    titles = ["initial condition " + head_title(tr["setting"], "seed")
              for tr in data["trajectories"]]
    return heads_draw(data, titles, "Fig. 14: softmax, H = 8, Gaussian ν = (20, 1, 1), L = 5, "
                                    "two initial conditions (ODE)", columns=2)
