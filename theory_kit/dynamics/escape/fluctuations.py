"""Finite-D fluctuations: the SGD increments, their covariance Σ, the covariance Σ₀ of the initial
overlaps and the one-step propagators of the linear process (issue #14; docs/theory.md §7, §8).

Fluctuations.  One SGD step moves x by Z/D with the per-sample increment (r = y − ŷ,
G_{hl} = ∂ŷ/∂s_{hl}, R_h = ∂ŷ/∂Q_{hh}, u_f·x_l = p_{fl} + 1[l = ε] θ_f)

    Z^M_{hf}   = γ r (Σ_l G_{hl} p_{fl} + 2 R_h m_{hf})
    Z^Q_{hh'}  = γ r (Σ_l G_{hl} s_{h'l} + 2 R_h Q_{hh'}) + (h ↔ h') + γ² r² Σ_l G_{hl} G_{h'l}
    Z^a_h = γ_a r ∂ŷ/∂a_h,   Z^b_h = γ_b r ∂ŷ/∂b_h,

(x_l·x_l/D → 1 in the γ² part; its O(D^{-1/2}) fluctuations and the l ≠ l' cross terms add
O(D^{-3/2}) per step).  D steps make one unit of time, so E Z is the drift and the covariance
per unit time is Cov(Z)/D: Σ(t) = Cov Z at X_sym(t).  It is estimated by Monte Carlo over
(θ, ε, c, tokens), values c included, with a batch standard error.
Initial overlaps of keys k_h ~ N(0, η²/D I): ξ(0) = √D (X(0) − X_sym(0)) has mean 0 and, exactly
at every D, Var m_{hf} = η², Var Q_{hh} = 2η⁴, Var Q_{hh'} = η⁴ (h ≠ h'), no covariances (Σ₀);
the samplers draw X(0) from its exact law (``simulate.ReducedState.drawn``).

Propagators.  The linear process dξ = J ξ dt + Σ^{1/2} dW is discretised exactly for J
piecewise constant: over a step h with J and Σ at the step's midpoint,
ξ ← A ξ + N(0, Q_h) with A = e^{Jh} and Q_h = ∫_0^h e^{Js} Σ e^{Jᵀs} ds ≈ Σh + (JΣ + ΣJᵀ)h²/2;
Φ(t_k) = A_{k−1} ⋯ A_0 is the fundamental matrix of that J (dΦ/dt = J Φ, Φ(0) = I).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg import expm

from ... import kernels
from ...model.activations import Activation
from ...model.state import State
from ...model.task import Task
from ..sgd_step import psd_factor
from .coordinates import Coordinates

NOISE_BATCH = 4096


def increments(task: Task, act: Activation, coords: Coordinates, state: State,
               rates: tuple[float, float, float], rng: np.random.Generator, n: int) -> np.ndarray:
    """n per-sample SGD increments Z (n × coords.n), see the module docstring; one step moves
    x by Z/D.  Tokens are drawn on an orthonormal system containing span{u, k}: the keys have
    coordinates [M | P], P Pᵀ = Q − M Mᵀ, and a token has N(0, I) coordinates (p, q), plus θ on
    p at the signal token (ε = 0 by exchangeability)."""
    H, F, L = coords.H, coords.F, task.L
    M, Q = state.M, state.Q
    theta = task.prior.sample(rng, n)
    p = rng.standard_normal((n, F, L))
    p[:, :, 0] += theta
    S = M @ p + psd_factor(state.orthogonal_part()) @ rng.standard_normal((n, H, L))
    c = rng.standard_normal((n, L))
    y = c[:, 0] + math.sqrt(task.delta) * rng.standard_normal(n)
    kern = kernels.sample_kernels(act)
    W, D, D2, w = kern.weights(S, state.b, np.diag(Q), state.a)
    # ∂ŷ/∂s_hl = J_hl·c and ∂ŷ/∂a_h, ∂ŷ/∂b_h, ∂ŷ/∂Q_hh (generated VJPs with v = c)
    G, dy_da, dy_db, dy_dq = kern.vjp(W, D, D2, state.a, c)
    g, ga, gb = rates
    r = y - np.einsum("nl,nl->n", w, c)
    beta = (g * r)[:, None, None] * G                      # γ r G, (n, H, L)
    ZM = beta @ np.swapaxes(p, 1, 2)
    half = beta @ np.swapaxes(S, 1, 2)
    if act.offset == "bayes":                              # γ r 2R_h, R_h = ∂ŷ/∂Q_hh
        rho = (2 * g * r)[:, None] * dy_dq
        ZM = ZM + rho[:, :, None] * M
        half = half + rho[:, :, None] * Q
    ZQ = half + np.swapaxes(half, 1, 2) + beta @ np.swapaxes(beta, 1, 2)
    da = (ga * r)[:, None] * dy_da
    db = (gb * r)[:, None] * dy_db
    return coords.vector(ZM, ZQ, da, db)


def noise_covariance(task: Task, act: Activation, coords: Coordinates, state: State,
                     rates: tuple[float, float, float], n_samples: int, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ, stderr of Σ, E Z): Σ = Cov Z (n × n) at ``state`` from ``n_samples`` increments,
    the standard error from the spread of batch estimates."""
    rng = np.random.default_rng(seed)
    n_batches = max(2, -(-n_samples // NOISE_BATCH))
    size = -(-n_samples // n_batches)
    covs, means = [], []
    for _ in range(n_batches):
        Z = increments(task, act, coords, state, rates, rng, size)
        covs.append(np.cov(Z, rowvar=False))
        means.append(Z.mean(axis=0))
    stacked = np.array(covs)
    return (stacked.mean(axis=0), stacked.std(axis=0, ddof=1) / np.sqrt(n_batches),
            np.mean(means, 0))


def initial_covariance(coords: Coordinates, eta: float) -> np.ndarray:
    """Σ₀: covariance of ξ(0) = √D (X(0) − X_sym(0)) for k_h(0) ~ N(0, η²/D I) (exact at all D):
    Var m_{hf} = η², Var Q_{hh} = 2η⁴, Var Q_{hh'} = η⁴, zero covariances; a, b fixed."""
    H = coords.H
    iu = np.triu_indices(H)
    q = np.where(iu[0] == iu[1], 2.0, 1.0) * eta ** 4
    diag = np.concatenate([np.full(coords.n_m, eta ** 2), q,
                           np.zeros(coords.n - coords.n_m - len(q))])
    return np.diag(diag)


def propagators(t: np.ndarray, J: np.ndarray, Sigma: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-step propagators A_k = e^{J_mid h}, noise covariances Σ_mid h + (JΣ + ΣJᵀ)_mid h²/2
    (the O(h²) expansion of ∫_0^h e^{Js} Σ e^{Jᵀs} ds), and Φ(t_k) = A_{k−1} ⋯ A_0."""
    h = np.diff(t)
    Jm, Sm = 0.5 * (J[1:] + J[:-1]), 0.5 * (Sigma[1:] + Sigma[:-1])
    A = np.array([expm(Jk * hk) for Jk, hk in zip(Jm, h)])
    JS = Jm @ Sm
    Qs = Sm * h[:, None, None] + (JS + np.swapaxes(JS, 1, 2)) * (h ** 2 / 2)[:, None, None]
    Qs = 0.5 * (Qs + np.swapaxes(Qs, 1, 2))
    Phi = np.empty_like(J)
    Phi[0] = np.eye(J.shape[1])
    for k in range(len(h)):
        Phi[k + 1] = A[k] @ Phi[k]
    return A, Qs, Phi
