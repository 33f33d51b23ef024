"""Fig. 1: the ODE (theory) against finite-D SGD for softmax attention.

Caption: L = 10, H = 2 heads, softmax, F = 2, flipping spike ν1 = ν2 = 2, η = 1, SGD at
D = 10^4.  Panels: loss, m along f = 1 (constant direction), m along f = 2 (flipping-sign
direction), orthogonal component diag(Q − MMᵀ).  Our choices: the ODE drift of the full run
is the deterministic engine ``laplace`` (no sampling error; ~0.22 CPU s per drift along
the curve, adaptive rk45 steps), the quick run keeps scrambled Sobol points paired with their
head permutations (a fixed Monte Carlo set of affordable size shifts the plateau of m_{h1} by
several 0.01 and splits the heads spuriously), γ = 1 (larger γ slows the escape from
the unspecialised phase, because the γ² noise inflates the orthogonal part) and a horizon long
enough for the flipping direction to specialise; the ODE and every SGD run start from the same
initial overlaps drawn at D.  Simulation: exact reduced SGD (docs/theory.md §7).
Theory band (orange, m_h2 panel): the SGD τ_2 predicted by ``theory_kit.dynamics.escape``
from the same overlaps at the same D (linearised escape + SGD noise), mean ± std next to the
ODE's τ_2; its drift on ``laplace`` too (quick: 256 Sobol points, a smoke test).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .escape_pieces import EscapePiece, draw_band_in_time
from .panels import (
    QUICK_ERROR_SAMPLES,
    OverlayPlan,
    PlannedFigure,
    Setting,
    overlay_draw,
    run_pieces,
)

NUMBER = 1
CAPTION = ("ODE (lines; one style per head) against SGD (markers, one shape per "
           "head; mean ± std over runs): softmax, L = 10, H = 2, F = 2, "
           "flipping spike ν = (2, 2), η = 1, γ = 1; same initial overlaps for all.")
FULL = OverlayPlan((Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=250.0,
                            D_init=10_000),), D=10_000, runs=8, n_samples=8192, dt=1.0,
                   n_times_ode=126, n_times_sim=26, engine="laplace")
QUICK = OverlayPlan((Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=120.0,
                             D_init=300),), D=300, runs=8, n_samples=1024, dt=1.0,
                    n_times_ode=61, n_times_sim=25, engine="sobol-sym",
                    error_samples=QUICK_ERROR_SAMPLES)
FIGURE = PlannedFigure(FULL, QUICK)
plan = FIGURE.plan
M_F2_PANEL = 2   # the panels are error, m_h1, m_h2, orthogonal part


def theory_piece(quick: bool) -> EscapePiece:
    """The predicted SGD law of τ_2 at the plan's D from the same initial overlaps
    (``theory_kit.dynamics.escape``, given overlaps: only the SGD noise is random)."""
    p = plan(quick)
    return EscapePiece(p.settings[0], (p.D,), points=256 if quick else p.n_samples, given=True,
                       engine="sobol" if quick else "laplace")


def estimate_seconds(quick: bool) -> float:
    return FIGURE.estimate_seconds(quick) + theory_piece(quick).seconds()


def compute(quick: bool, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
    data = FIGURE.compute(quick, workdir, jobs, executor)
    theory = run_pieces([theory_piece(quick)], workdir, 1, desc="escape theory",
                        executor=executor)[0]
    return {**data, "theory": theory}


def draw(data: dict) -> Figure:
    activation = data["rows"][0]["setting"]["activation"]
    theory = data.get("theory")

    def band(axes: list[Axes]) -> None:
        if theory is not None:
            draw_band_in_time(axes[M_F2_PANEL], theory)

    return overlay_draw(data, f"Fig. 1: {activation}, L = 10, H = 2, flipping ν = (2, 2)",
                        band)
