"""First crossings of the linear process: sampled spreads, the law of τ_f and its one-mode closed
forms (issue #14; docs/theory.md §8).

Prediction.  X ≈ X_sym + ξ/√D with dξ = J ξ dt + Σ^{1/2} dW, stepped with the propagators
of :mod:`.fluctuations` (ξ ← e^{Jh} ξ + N(0, Q_h)).  The spread along f is
d_f = ‖L_f ξ‖/√D (L_f: m_{:,f} minus its head mean); the linear τ_f is its first crossing
of δ, linearly interpolated between grid times.  ξ(0) is drawn from the exact law of the
initial overlaps at D (Σ₀, :mod:`.fluctuations`) or given; the law of τ over the samples is
summarised by its mean, standard deviation, standard error and 10/50/90 % quantiles.

Closed forms (one unstable mode, H = 2).  ℓ·ξ(t) is Gaussian with standard deviation g(t),
g² = tr(L_f C₂ L_fᵀ) (C₂ the second moment of ξ), so the linear τ solves g(τ)|Z| = δ√D with
Z ~ N(0, 1): with λ_g = d ln g/dt, ⟨τ⟩ ≈ g⁻¹(δ√D e^{−E ln|Z|}) = ln D/(2λ_g) + const
(E ln|Z| = −(γ_E + ln 2)/2) and Var τ ≈ Var ln|Z|/λ_g² = π²/(8λ_g²), independent of D.
"""
from __future__ import annotations

import math

import numpy as np

from ..sgd_states import ReducedState
from ..sgd_step import psd_factor
from .linearisation import Linearisation

E_LOG_ABS_NORMAL = -(np.euler_gamma + np.log(2.0)) / 2   # E ln|Z|, Z ~ N(0, 1)
VAR_LOG_ABS_NORMAL = np.pi ** 2 / 8                      # Var ln|Z|


def first_crossing(t: np.ndarray, values: np.ndarray, threshold: float) -> np.ndarray:
    """First t with values > threshold, per row of values (runs × nt), linearly interpolated;
    t[0] if already above at t[0]; inf if never (vectorised ``analysis.crossing_time``)."""
    above = values > threshold
    hit = above.any(axis=1)
    i = np.argmax(above, axis=1)
    out = np.full(values.shape[0], np.inf)
    first = hit & (i == 0)
    out[first] = t[0]
    mid = hit & (i > 0)
    r, k = np.flatnonzero(mid), i[mid]
    x0, x1 = values[r, k - 1], values[r, k]
    out[r] = t[k - 1] + (threshold - x0) / (x1 - x0) * (t[k] - t[k - 1])
    return out


def sample_spreads(lin: Linearisation, xi0: np.ndarray, f: int, rng: np.random.Generator,
                   noise: bool = True) -> np.ndarray:
    """√D × spread along f of the linear process: ‖L_f ξ(t)‖ (runs × nt) from ξ(0) = xi0
    (runs × n); ``noise=False`` drops the SGD noise (the ODE from the same start)."""
    Lf = lin.coords.spread_rows(f)
    roots = np.array([psd_factor(Qk) for Qk in lin.Qstep])
    xi = np.array(xi0, float)
    out = np.empty((xi.shape[0], len(lin.t)))
    out[:, 0] = np.linalg.norm(xi @ Lf.T, axis=1)
    for k in range(len(lin.t) - 1):
        xi = xi @ lin.A[k].T
        if noise:
            xi += rng.standard_normal(xi.shape) @ roots[k].T
        out[:, k + 1] = np.linalg.norm(xi @ Lf.T, axis=1)
    return out


def drawn_xi0(lin: Linearisation, D: int, eta: float, runs: int,
              rng: np.random.Generator) -> np.ndarray:
    """ξ(0) = √D (X(0) − X_sym(0)) with X(0) from the exact law of keys drawn at D."""
    c = lin.coords
    st = ReducedState.drawn(rng, runs, c.H, c.F, D, eta)
    M, Q = st.order_parameters()
    a = np.tile(lin.a0, (runs, 1))
    b = np.tile(lin.b0, (runs, 1))
    return math.sqrt(D) * (c.vector(M, Q, a, b) - lin.x[0])


def tau_summary(taus: np.ndarray) -> dict:
    """Law of τ over samples: mean, std (ddof = 1), standard error of the mean, 10/50/90 %
    quantiles over the ones that crossed, and the fraction that crossed (inf = not by T)."""
    ok = taus[np.isfinite(taus)]
    if ok.size < 2:
        return {"mean": np.inf, "std": np.nan, "mean_se": np.nan, "q10": np.inf,
                "median": np.inf, "q90": np.inf, "fraction": float(ok.size / taus.size)}
    q10, q50, q90 = np.percentile(ok, [10, 50, 90])
    std = float(np.std(ok, ddof=1))
    return {"mean": float(ok.mean()), "std": std, "mean_se": std / math.sqrt(ok.size),
            "q10": float(q10), "median": float(q50), "q90": float(q90),
            "fraction": float(ok.size / taus.size)}


def closed_forms(lin: Linearisation, second_moment: np.ndarray, f: int, D: int,
                 delta: float) -> dict:
    """One-mode closed forms from g(t) = √tr(L_f C₂ L_fᵀ) (module docstring): ⟨τ⟩ solves
    ln g = ln(δ√D) − E ln|Z|; std τ = π/(√8 λ_g(τ)); also λ(τ) of the antisymmetric block with
    its slope 1/(2λ) of ⟨τ⟩ against ln D and std π/(√8 λ)."""
    Lf = lin.coords.spread_rows(f)
    g2 = np.einsum("ij,tjk,ik->t", Lf, second_moment, Lf)
    log_g = 0.5 * np.log(np.maximum(g2, 1e-300))
    rate = np.gradient(log_g, lin.t)
    target = math.log(delta * math.sqrt(D)) - E_LOG_ABS_NORMAL
    tau = first_crossing(lin.t, log_g[None], target)[0]
    if not np.isfinite(tau):
        return {"mean": np.inf, "std": np.nan, "lambda_g": np.nan, "lambda": np.nan,
                "slope": np.nan, "std_lambda": np.nan}
    lam_g = float(np.interp(tau, lin.t, rate))
    lam = float(np.interp(tau, lin.t, lin.lam))
    return {"mean": float(tau), "std": math.sqrt(VAR_LOG_ABS_NORMAL) / lam_g, "lambda_g": lam_g,
            "lambda": lam, "slope": 1.0 / (2 * lam),
            "std_lambda": math.sqrt(VAR_LOG_ABS_NORMAL) / lam}
