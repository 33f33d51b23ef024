"""Fig. 11: cosine similarity of the two heads at the end of training over the (ν1, ν2) plane.

Caption: softmax, H = 2, flipping spike, F = 2, L = 4, as a function of the signal strengths of
the constant (ν1) and flipping-sign (ν2) directions.  Our choices: γ = 1, η = 1, initial
overlaps drawn at D = 10^4 (also quick), horizon T = 1500 ("end of training"; quick 1000 — at
L = 4 the split along the flipping direction takes several hundred time units, so a shorter
horizon only measures the unspecialised phase); one ODE per grid point, drift on scrambled
Sobol points (2048 full, 512 quick).  Not on the deterministic ``laplace`` engine: at L = 4
no pattern keeps a plain noise token to cut its u grid, and along these plateaus Q grows to
~5; one laplace drift cost 1–3 CPU s there until its inner kernel stopped falling back to the
direct path at L ≤ 5, and now ~0.17 CPU s at Q ≈ 4.5 (at one state, reference machine), so
the 25 points would take an estimated ~1–2 CPU h (~700 drifts each, more at ν = 8 where Q is
larger; not run) against ~7 min on Sobol points.
Cosine similarity k_1·k_2/√(Q_11 Q_22): 1 = the heads learned the same thing, lower = they
specialised.
Right panel (beyond the paper): how long specialisation takes, the predicted mean SGD τ_2 at
D = 10^4 for keys drawn at D (``theory_kit.dynamics.escape``: linearised escape from the
head-symmetric plateau plus finite-D fluctuations; 2000 samples per point; drift on 1024 Sobol
points paired with the head swap; quick: 128 points and 500 samples, a smoke test), with the
ODE's τ_2 from the one drawn start in brackets.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from .. import analysis
from .escape_pieces import EscapePiece, predicted
from .panels import QUICK_ERROR_SAMPLES, OdePiece, Setting, pieces_seconds, run_pieces
from .style import SMALL, new_figure

NUMBER = 11
CAPTION = ("Cosine similarity of the two softmax heads at the end of training (ODE, T = 1500) over "
           "(ν1, ν2): H = 2, flipping spike, F = 2, L = 4, η = 1, γ = 1.")


def grid(quick: bool) -> tuple[np.ndarray, np.ndarray]:
    values = np.array([1.0, 9.0]) if quick else np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    return values, values


def pieces(quick: bool) -> list[OdePiece]:
    nu1, nu2 = grid(quick)
    base = Setting("softmax", 4, 2, "flipping", (1.0, 1.0), T=1000.0 if quick else 1500.0)
    n, dt = (512, 6.0) if quick else (2048, 3.0)
    # the figure shows the final cosine only: a rough error curve is enough
    return [OdePiece(base.with_(nu=(float(a), float(b))), n, dt, n_times=31 if quick else 61,
                     engine="sobol", error_samples=QUICK_ERROR_SAMPLES) for a in nu1 for b in nu2]


ESCAPE_D = 10_000


def theory_pieces(quick: bool) -> list[EscapePiece]:
    """The predicted law of τ_2 at D = 10⁴ at every grid point (keys drawn at D)."""
    return [EscapePiece(p.setting, (ESCAPE_D,), runs=500 if quick else 2000,
                        points=128 if quick else 1024, dt=5.0, every=100.0 if quick else 25.0)
            for p in pieces(quick)]


def estimate_seconds(quick: bool) -> float:
    return pieces_seconds(pieces(quick)) + pieces_seconds(theory_pieces(quick))


def compute(quick: bool, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
    plan = pieces(quick)
    theory = theory_pieces(quick)
    results = run_pieces([*plan, *theory], workdir, jobs, desc="ODE grid + escape theory",
                         executor=executor)
    predictions, results = results[len(plan):], results[:len(plan)]
    nu1, nu2 = grid(quick)
    cos = np.array([analysis.cosine_similarity(np.asarray(r["Q"])[-1])[0, 1] for r in results])
    tau2 = np.array([analysis.specialisation_times(r["t"], r["M"])[1] for r in results])
    shape = (len(nu1), len(nu2))
    return {"params": {"setting": plan[0].setting.params(), "n_samples": plan[0].n_samples,
                       "dt": plan[0].dt, "T": plan[0].setting.T},
            "nu1": nu1, "nu2": nu2, "cosine": cos.reshape(shape), "tau_2": tau2.reshape(shape),
            "final_error": np.array([r["error"][-1] for r in results]).reshape(shape),
            "escape": {"D": ESCAPE_D, "points": theory[0].points,
                       "tau_2_mean": np.array([predicted(r)[0]
                                               for r in predictions]).reshape(shape),
                       "tau_2_std": np.array([predicted(r, "std")[0]
                                              for r in predictions]).reshape(shape),
                       "fraction": np.array([predicted(r, "fraction")[0]
                                             for r in predictions]).reshape(shape)}}


def _grid_axes(ax: Axes, nu1: np.ndarray, nu2: np.ndarray) -> None:
    ax.set_xticks(range(len(nu1)), [f"{v:g}" for v in nu1])
    ax.set_yticks(range(len(nu2)), [f"{v:g}" for v in nu2])
    ax.grid(False)
    ax.set_xlabel(r"$\nu_1$ (constant direction)")
    ax.set_ylabel(r"$\nu_2$ (flipping direction)")


def _draw_escape(fig: Figure, ax: Axes, data: dict) -> None:
    """Predicted ⟨τ_2⟩ at D = 10⁴ (log colour scale; '> T' when most samples do not cross),
    the ODE's τ_2 in brackets."""
    nu1, nu2 = np.asarray(data["nu1"]), np.asarray(data["nu2"])
    esc = data["escape"]
    mean = np.asarray(esc["tau_2_mean"], float)
    frac = np.asarray(esc["fraction"], float)
    ode = np.asarray(data["tau_2"], float)
    shown = np.where((frac >= 0.5) & np.isfinite(mean), mean, np.nan)
    low = max(np.nanmin(shown), 1.0) if np.isfinite(shown).any() else 1.0
    high = float(data["params"]["T"])
    image = ax.imshow(shown.T, origin="lower", cmap="magma_r", aspect="auto",
                      norm=LogNorm(vmin=low, vmax=high))
    for i in range(len(nu1)):
        for j in range(len(nu2)):
            text = f"{mean[i, j]:.0f}" if np.isfinite(shown[i, j]) else "> T"
            text += f"\n({ode[i, j]:.0f})" if np.isfinite(ode[i, j]) else "\n(–)"
            dark = np.isfinite(shown[i, j]) and shown[i, j] > np.sqrt(low * high)
            ax.text(i, j, text, ha="center", va="center", fontsize=SMALL,
                    color="white" if dark else "0.1")
    _grid_axes(ax, nu1, nu2)
    fig.colorbar(image, ax=ax,
                 label=rf"predicted $\langle\tau_2\rangle$ of SGD at D = {esc['D']:g}")
    ax.set_title("how long specialisation takes\n(theory; the ODE's τ₂ in brackets)",
                 fontsize=SMALL)


def draw(data: dict) -> Figure:
    nu1, nu2 = np.asarray(data["nu1"]), np.asarray(data["nu2"])
    cos = np.asarray(data["cosine"])
    with_escape = data.get("escape") is not None
    fig, axes = new_figure(1, 2 if with_escape else 1, panel_size=(4.4, 3.6))
    ax = axes[0]
    image = ax.imshow(cos.T, origin="lower", cmap="viridis", vmin=min(0.0, np.nanmin(cos)),
                      vmax=1.0, aspect="auto")
    for i in range(len(nu1)):
        for j in range(len(nu2)):
            ax.text(i, j, f"{cos[i, j]:.2f}", ha="center", va="center", fontsize=SMALL,
                    color="white" if cos[i, j] < 0.6 else "black")
    _grid_axes(ax, nu1, nu2)
    fig.colorbar(image, ax=ax, label=r"$k_1\cdot k_2/\sqrt{Q_{11}Q_{22}}$ at $t = T$")
    ax.set_title(f"Fig. 11: softmax, H = 2, L = 4, T = {data['params']['T']:g}", fontsize=9)
    if with_escape:
        _draw_escape(fig, axes[1], data)
    fig.tight_layout()
    return fig
