"""Containers and projections of the per-sample drift integrands (docs/theory.md §5).

The drifts are expectations of the per-sample integrands dM, dQ^lin, dQ^noise, da, db
(formulas: ``codegen.drift_integrand`` and docs/theory.md §5).
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
