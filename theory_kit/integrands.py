"""Per-sample integrands of the order-parameter drifts (THEORY §5), from the activation kernel.

With e = δ_ε − w, g_{hl} = J_{hl}·e, ρ_h = ∂w/∂Q_{hh}·e and, by the conditional mean,
P_{fl} = E[u_f·x_l | s] = (Mᵀ Q⁺ ζ_l)_f + 1[l = ε] θ_f, the drifts are expectations of

    dM_{hf}      = Σ_l g_{hl} P_{fl} + 2 ρ_h m_{hf}                          (× γ)
    dQ^lin_{hh'} = Σ_l g_{hl} s_{h'l} + 2 ρ_h Q_{hh'} + (h ↔ h')              (× γ)
    dQ^noise_{hh'} = (|e|² + Δ) Σ_l J_{hl}·J_{h'l} + 2 Σ_l g_{hl} g_{h'l}     (× γ²)
    da_h = ∂w/∂a_h·e (× γ_a),   db_h = Σ_l g_{hl} (× γ_b).

The integrands themselves are generated from the SymPy derivation (``derive`` → ``codegen``);
this module holds their container and the conditional-mean projection.  The hand-structured
NumPy version lives in ``tests/oracle.py`` as the independent oracle they are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
