"""Independent oracle for the generated kernels: the hand-structured NumPy drift integrands.

These formulas were written by hand from docs/theory.md §5 (not derived by SymPy, not generated), on
top of the hand VJP kernel ``activations.Kernel`` (``Activation.kernel``).  The production path
runs the code generated from ``derive.py``; the tests check that it agrees with this oracle to
round-off, and that a deliberately wrong generated derivative makes that check fail.

With e = δ_ε − w, g_{hl} = J_{hl}·e, ρ_h = ∂w/∂Q_{hh}·e and, by the conditional mean,
P_{fl} = E[u_f·x_l | s] = (Mᵀ Q⁺ ζ_l)_f + 1[l = ε] θ_f, the drifts are expectations of

    dM_{hf}      = Σ_l g_{hl} P_{fl} + 2 ρ_h m_{hf}                          (× γ)
    dQ^lin_{hh'} = Σ_l g_{hl} s_{h'l} + 2 ρ_h Q_{hh'} + (h ↔ h')              (× γ)
    dQ^noise_{hh'} = (|e|² + Δ) Σ_l J_{hl}·J_{h'l} + 2 Σ_l g_{hl} g_{h'l}     (× γ²)
    da_h = ∂w/∂a_h·e (× γ_a),   db_h = Σ_l g_{hl} (× γ_b).
"""
from __future__ import annotations

import numpy as np

from theory_kit.activations import Activation, pair_products
from theory_kit.integrands import DriftSamples, projection_matrix


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

