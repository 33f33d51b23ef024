"""Fig. 3: the H = 8 heads for a Gaussian prior at F = 3, softmax against B-softmax (ODE).

Caption: non-isotropic Gaussian prior, F = 3, L = 5, ν1 = 20, ν2 = 1 (we take ν3 = 1 as the
caption's "…"), η = 1; left softmax, right B-softmax.  Our choices: γ = 1, T = 200, initial
overlaps drawn at D = 10^4; Monte Carlo drift with few samples (H = 8 and 8 sign patterns of θ
make each evaluation expensive).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .panels import HeadsPlan, Setting, head_plan, head_title, heads_compute, heads_draw

NUMBER = 3
BASE = Setting("softmax", 5, 8, "gaussian", (20.0, 1.0, 1.0), T=200.0)
SETTINGS = (BASE, BASE.with_(activation="bsoftmax"))
CAPTION = ("Head trajectories m_hf(t) from the ODE: H = 8, Gaussian prior, F = 3, L = 5, "
           "ν = (20, 1, 1), η = 1, γ = 1; left softmax, right B-softmax; dashed: τ_f.")


def plan(quick: bool) -> HeadsPlan:
    return head_plan(SETTINGS, quick, n_full=250, n_quick=50, dt_full=2.0, dt_quick=2.5,
                     T_quick=100.0)


def estimate_seconds(quick: bool) -> float:
    return plan(quick).seconds()


def compute(quick: bool, workdir: Path, jobs: int = 1) -> dict:
    return heads_compute(plan(quick), workdir, jobs)


def draw(data: dict) -> Figure:
    titles = [head_title(tr["setting"], "activation") for tr in data["trajectories"]]
    return heads_draw(data, titles, "Fig. 3: H = 8 heads, Gaussian ν = (20, 1, 1), L = 5 (ODE)",
                      columns=2)
