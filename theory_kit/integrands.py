"""Per-sample integrands of the order-parameter drifts (THEORY §5), from the activation kernel.

With e = δ_ε − w, g_{hl} = J_{hl}·e, ρ_h = ∂w/∂Q_{hh}·e and, by the conditional mean,
P_{fl} = E[u_f·x_l | s] = (Mᵀ Q⁺ ζ_l)_f + 1[l = ε] θ_f, the drifts are expectations of

    dM_{hf}      = Σ_l g_{hl} P_{fl} + 2 ρ_h m_{hf}                          (× γ)
    dQ^lin_{hh'} = Σ_l g_{hl} s_{h'l} + 2 ρ_h Q_{hh'} + (h ↔ h')              (× γ)
    dQ^noise_{hh'} = (|e|² + Δ) Σ_l J_{hl}·J_{h'l} + 2 Σ_l g_{hl} g_{h'l}     (× γ²)
    da_h = ∂w/∂a_h·e (× γ_a),   db_h = Σ_l g_{hl} (× γ_b).

This is the hand-structured NumPy reference; the SymPy-derived, code-generated integrands
(``derive`` → ``codegen``) must agree with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import Activation, pair_products


@dataclass
class DriftSamples:
    """Per-sample drift integrands, leading axis = samples."""

    dM: np.ndarray        # (n, H, F)
    dQ_lin: np.ndarray    # (n, H, H)
    dQ_noise: np.ndarray  # (n, H, H)
    da: np.ndarray        # (n, H)
    db: np.ndarray        # (n, H)
    sq_err: np.ndarray    # (n,) |e|², so that E = Δ + E|e|²


def conditional_projections(theta: np.ndarray, zeta: np.ndarray, M: np.ndarray,
                            Q: np.ndarray) -> np.ndarray:
    """P_{fl} = (Mᵀ Q⁺ ζ_l)_f + 1[l = 0] θ_f, shape (n, F, L).

    Q⁺ is the Moore–Penrose pseudo-inverse: ζ lies in the range of Q almost surely."""
    P = projection_matrix(M, Q) @ zeta
    P[:, :, 0] += theta
    return P


def projection_matrix(M: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """B = Mᵀ Q⁺ (F × H), so that E[u·x_l | ζ] = B ζ_l off the signal token."""
    return M.T @ np.linalg.pinv(Q, hermitian=True)


def reference_drift_integrands(act: Activation, S: np.ndarray, zeta: np.ndarray,
                               theta: np.ndarray, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                               b: np.ndarray, delta: float = 0.0) -> DriftSamples:
    """The integrands above at scores S (n, H, L) with the signal at token 0.

    Only token 0 carries θ, so with gζ_{hh'} = Σ_l g_{hl} ζ_{h'l} the two token sums are
    Σ_l g_{hl} P_{fl} = (gζ Bᵀ)_{hf} + g_{h0} θ_f and Σ_l g_{hl} s_{h'l} = gζ_{hh'} + g_{h0} (Mθ)_{h'}."""
    kern = act.kernel(S, a, b, np.diag(Q))
    e = -kern.w
    e[:, 0] += 1.0
    sq = np.einsum("nl,nl->n", e, e)
    g = kern.jvp_tokens(e)                      # (n, H, L)
    rho2 = 2 * kern.grad_qdiag(g)[:, :, None]   # (n, H, 1)
    g0 = g[:, :, 0, None]
    gz = pair_products(g, zeta)
    dM = gz @ projection_matrix(M, Q).T + g0 * theta[:, None, :] + rho2 * M
    half = gz + g0 * (theta @ M.T)[:, None, :] + rho2 * Q
    dQ_lin = half + np.swapaxes(half, 1, 2)
    dQ_noise = (sq + delta)[:, None, None] * kern.jj_sum() + 2 * pair_products(g, g)
    return DriftSamples(dM, dQ_lin, dQ_noise, kern.grad_a(e), kern.grad_b(g), sq)
