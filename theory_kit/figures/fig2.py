"""Fig. 2: evolution of the heads (softmax, F = 2, L = 4, η = 1), ODE.

Caption: left flipping spike ν1 = ν2 = 2, right non-isotropic Gaussian ν1 = 8, ν2 = 2.  The
caption does not give H; we use H = 4.  Our choices: γ = 1, T = 300, initial overlaps drawn at
D = 10^4.  Each group shows m_{hf}(t) for every head along f = 1 (top) and f = 2 (bottom),
with the specialisation time τ_f (δ = 0.2) dashed.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .panels import HeadsPlan, Setting, head_plan, head_title, heads_compute, heads_draw

NUMBER = 2
SETTINGS = (Setting("softmax", 4, 4, "flipping", (2.0, 2.0), T=300.0),
            Setting("softmax", 4, 4, "gaussian", (8.0, 2.0), T=300.0))
CAPTION = ("Head trajectories m_hf(t) from the ODE: softmax, H = 4, L = 4, η = 1, γ = 1; left "
           "flipping ν = (2, 2), right Gaussian ν = (8, 2); dashed: τ_f (δ = 0.2).")


def plan(quick: bool) -> HeadsPlan:
    return head_plan(SETTINGS, quick, n_full=2000, n_quick=400, T_quick=150.0)


def estimate_seconds(quick: bool) -> float:
    return plan(quick).seconds()


def compute(quick: bool, workdir: Path, jobs: int = 1) -> dict:
    return heads_compute(plan(quick), workdir, jobs)


def draw(data: dict) -> Figure:
    titles = [head_title(tr["setting"], "prior", "nu", "H") for tr in data["trajectories"]]
    return heads_draw(data, titles, "Fig. 2: softmax heads, L = 4 (ODE)", columns=2)
