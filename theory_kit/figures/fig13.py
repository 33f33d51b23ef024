"""Fig. 13: evolution of the heads for H ∈ {2, 5, 8}, Gaussian prior (softmax, F = 2, L = 4).

Caption: non-isotropic Gaussian prior, ν1 = ν2 = 2 (top) and ν1 = 8, ν2 = 2 (bottom), L = 4,
η = 1.  Our choices: softmax, γ = 1, T = 1500 (quick 1000), initial overlaps drawn at
D = 10^4 (also in quick mode), drift on scrambled Sobol points (1024 full, 256 quick).

What to see: ν = (2, 2) — the heads sit near m = 0 for ~100 time units (unspecialised), then
leave it towards different mixtures of u_1 and u_2; ν = (8, 2) — the heads first align with
the strong direction u_1 with random signs, and only much later part along u_2.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .panels import Setting, head_figure, head_titles, heads_draw

NUMBER = 13
HEADS = (2, 5, 8)
SETTINGS = tuple(Setting("softmax", 4, H, "gaussian", nu, T=1500.0)
                 for nu in ((2.0, 2.0), (8.0, 2.0)) for H in HEADS)
CAPTION = ("Head trajectories m_hf(t) from the ODE for H = 2, 5, 8: softmax, Gaussian prior, "
           "L = 4, η = 1 (overlaps drawn at D = 10^4), γ = 1; top ν = (2, 2), bottom ν = (8, 2); "
           "shaded: unspecialised phase; dashed: τ_f (δ = 0.2).")
FIGURE = head_figure(SETTINGS, n_full=1024, n_quick=256, dt_full=3.0, dt_quick=6.0,
                     T_quick=1000.0, D_quick=None, engine="sobol")
plan, compute = FIGURE.plan, FIGURE.compute
# A reference constant of the cost model (CPU seconds of the reference machine, as the
# pieces' model): the cost per recorded time beyond the error curve that the pieces' model
# counts, the piece's checkpoint and the record itself.  It matters here, where a piece has
# only T/dt = 167 RK4 steps per 51 records.
RECORD_SECONDS = 0.01


def estimate_seconds(quick: bool) -> float:
    """The pieces' cost model plus the per-record cost (``RECORD_SECONDS``)."""
    records = sum(piece.n_times for piece in plan(quick).pieces())
    return FIGURE.estimate_seconds(quick) + RECORD_SECONDS * records


def draw(data: dict) -> Figure:
    return heads_draw(data, head_titles(data, "nu", "H"),
                      "Fig. 13: softmax heads, Gaussian prior, L = 4 (ODE)", columns=3)
