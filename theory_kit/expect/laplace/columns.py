"""Score columns: the Gaussian law of one token's scores, and the atoms of the drift monomials
evaluated at its nodes (step 4 of the ``laplace`` package).

A one-token table averages over one column: the noise column N(0, Q), or a signal group (the
signal atoms with one score mean Mθ, :func:`column_groups`; one N(0, C) column for a Gaussian
prior).  :class:`_NodeColumn` holds a column's nodes (set by the rules of ``engine``) and the
atom values there: ψ = log φ, φ′/φ, φ and φ′, the scores S and the projections P = R s (+ the
θ part r, :func:`merged_column`).

Notes
-----
4. **Projections.**  E[p_{:,l} | s] = Mᵀ Q⁺ (s_{:,l} − δ_{l0} M θ) is linear in the scores, so P is
   a one-token function: P = B s on noise tokens (B = Mᵀ Q⁺), B (s − Mθ) + θ on the signal token
   of a discrete atom, and (I + diag ν) Mᵀ C⁺ s for a Gaussian prior (signal column N(0, C),
   C = Q + M diag ν Mᵀ, by linear Gaussian conditioning of θ and the projections on s_0).
   Signal atoms with the same score mean Mθ share their tables; their θ parts are summed with
   ``math.fsum``, so a flipping prior with m_{:,f} = 0 gives a drift of exactly 0 along f.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from ...kernels.integrands import projection_matrix
from ...model.activations import S_SYMBOL, Activation, lambdify_numpy
from ...model.priors import GaussianPrior
from ...model.task import Task
from ..quadrature import EIG_TOL
from .algebra import Mono


# ============================================================================ columns
@dataclass(frozen=True)
class ColumnGroup:
    """Score columns sharing one Gaussian law N(mean, cov) (signal atoms with equal Mθ).

    P = R s + r per atom; ``weight`` = Σ π_j and ``rbar`` = Σ_j π_j r_j (F,) (fsum)."""

    weight: float
    mean: np.ndarray
    cov: np.ndarray
    R: np.ndarray
    rbar: np.ndarray


def column_groups(task: Task, M: np.ndarray, Q: np.ndarray
                  ) -> tuple[ColumnGroup, list[ColumnGroup]]:
    """(noise column, signal groups) for the state (M, Q)."""
    H, F = M.shape
    B = projection_matrix(M, Q)
    noise = ColumnGroup(1.0, np.zeros(H), Q, B, np.zeros(F))
    prior = task.prior
    if isinstance(prior, GaussianPrior):
        C = Q + M @ np.diag(prior.nu) @ M.T
        R = np.diag(1.0 + prior.nu) @ M.T @ np.linalg.pinv(C, hermitian=True)
        return noise, [ColumnGroup(1.0, np.zeros(H), C, R, np.zeros(F))]
    atoms, pi = prior.atoms()
    by_mean: dict[tuple, list[int]] = {}
    means = atoms @ M.T
    for j in range(len(pi)):
        if pi[j] > 0:
            by_mean.setdefault(tuple(float(x) for x in means[j]), []).append(j)
    groups = []
    for key, idx in by_mean.items():
        mean = np.array(key)
        r = atoms[idx] - means[idx] @ B.T                      # θ − B M θ per atom
        rbar = np.array([math.fsum(pi[j] * r[i, f] for i, j in enumerate(idx))
                         for f in range(F)])
        groups.append(ColumnGroup(math.fsum(pi[idx]), mean, Q, B, rbar))
    return noise, groups


# ============================================================================ atoms at the nodes
class _NodeColumn:
    """Gaussian (or Gauss–Legendre) nodes of one column and the atom values at them.

    ``s[h]`` are score arrays broadcastable to ``shape``; ``w`` the node weights (``shape``)."""

    # set on the nested per-head rule only (``engine._Engine._nested_nodes``, ``merged_column``;
    # ``hasattr(col, "w1")`` tells the rules apart, so these are declarations, not defaults)
    first: int
    w1: np.ndarray
    w2: np.ndarray

    def __init__(self, act: Activation, c: np.ndarray, group: ColumnGroup,
                 s: list[np.ndarray], w: np.ndarray) -> None:
        self.act, self.group, self.s, self.w = act, group, s, w
        self.shape = w.shape
        self._cache: dict = {}
        self.t = [x + ch for x, ch in zip(s, c)]
        self.rnode: list[np.ndarray] | None = None    # θ parts per node (``merged_column``)

    def psi(self, h: int) -> np.ndarray:
        key = ("psi", h)
        if key not in self._cache:
            if self.act.log_psi is not None:
                val = self.act.psi_numpy(self.t[h])
            else:
                with np.errstate(divide="ignore"):
                    val = np.log(self.act.phi_numpy(self.t[h]))
            self._cache[key] = val
        return self._cache[key]

    def ratio(self, h: int) -> np.ndarray:
        """φ′/φ at the biased scores."""
        key = ("r1", h)
        if key not in self._cache:
            if self.act.is_plain_exp:
                val = np.ones_like(self.t[h])
            elif self.act.log_psi is not None:
                val = _log_ratio_fn(self.act)(self.t[h])
            else:
                val = _safe_ratio(_phi_prime(self.act)(self.t[h]),
                                  self.act.phi_numpy(self.t[h]))
            self._cache[key] = val
        return self._cache[key]

    def raw(self, h: int, which: str) -> np.ndarray:
        """φ or φ′ at the biased scores (elementwise activations)."""
        key = ("raw", which, h)
        if key not in self._cache:
            fn = self.act.phi_numpy if which == "W" else _phi_prime(self.act)
            self._cache[key] = fn(self.t[h])
        return self._cache[key]

    def linear(self, m: Mono, rows: slice = slice(None)) -> np.ndarray:
        """Product of the S and P atoms of m at the nodes (P = R s, without the θ part); with
        ``rows``, at those rows of the first axis only (the same values, entry by entry)."""
        out = np.ones(self.shape)[rows]
        s = [x[rows] for x in self.s]
        for x in m:
            if x[0] == "S":
                out = out * s[int(x[1:])]
            elif x[0] == "P":
                row = self.group.R[int(x[1:])]
                out = out * sum(row[h] * s[h] for h in range(len(s)))
            elif x[0] == "r":
                assert self.rnode is not None    # r atoms only on merged columns (``table``)
                out = out * self.rnode[int(x[1:])][rows]
        return out


def merged_column(cols: list[_NodeColumn], c: np.ndarray) -> _NodeColumn:
    """The signal columns of a discrete prior as one column: their nodes stacked along the
    first axis (z_1 for the nested rule) with the group weights π_c folded into the node
    weights, so that a table Σ_c π_c T_c is one sum over nodes (one batched pass instead of
    one per column, and no sum of tables).  The groups share the covariance Q (hence the
    rules) and the projection R = B; their θ parts r̄_c/π_c become a node-valued atom r_f
    (``linear``) whose group coefficient is 1 where some r̄_{c,f} ≠ 0 and exactly 0 otherwise
    (so a flipping prior with m_{:,f} = 0 still gives exactly 0 along f)."""
    first, groups = cols[0], [col.group for col in cols]
    if any(not np.array_equal(g.R, groups[0].R) for g in groups):
        raise AssertionError("the signal groups of a discrete prior share R = B")
    nested = hasattr(first, "w1")
    s = [np.concatenate([col.s[h] for col in cols]) for h in range(len(first.s))]
    rows = [len(col.w1) if nested else len(col.w) for col in cols]
    F = len(groups[0].rbar)
    rnode = [np.concatenate([np.full(n, col.group.rbar[f] / col.group.weight)
                             for n, col in zip(rows, cols)]) for f in range(F)]
    group = ColumnGroup(1.0, groups[0].mean, groups[0].cov, groups[0].R,
                        np.array([float(any(g.rbar[f] != 0.0 for g in groups)) for f in range(F)]))
    if not nested:
        w = np.concatenate([col.w * col.group.weight for col in cols])
        out = _NodeColumn(first.act, c, group, s, w)
    else:
        if any(not np.array_equal(col.w2, first.w2) for col in cols):
            raise AssertionError("the signal groups of a discrete prior share the z_2 rule")
        w1 = np.concatenate([col.w1 * col.group.weight for col in cols])
        out = _NodeColumn(first.act, c, group, s, np.outer(w1, first.w2))
        out.first, out.w1, out.w2 = first.first, w1, first.w2
        rnode = [r[:, None] for r in rnode]
    out.rnode = rnode
    return out


@lru_cache(maxsize=32)
def _phi_prime(act: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """φ′ as a NumPy callable."""
    return lambdify_numpy(act.scalar_derivatives[1])


@lru_cache(maxsize=32)
def _log_ratio_fn(act: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """ψ′ = φ′/φ for φ = e^ψ."""
    return lambdify_numpy(sp.diff(act.log_psi, S_SYMBOL))


def nested_factors(q: np.ndarray) -> tuple[int, int, float, float, float]:
    """(f, g, σ_1, β, σ_c) with s_f = μ_f + σ_1 z_1, s_g = μ_g + β z_1 + σ_c z_2 for a 2×2
    covariance, f the head of larger variance (so |β| ≤ σ_1 and the z_1 rule resolves both)."""
    first = 0 if q[0, 0] >= q[1, 1] else 1
    second = 1 - first
    s1 = float(np.sqrt(max(q[first, first], 0.0)))
    beta = float(q[first, second] / s1) if s1 > 0 else 0.0
    sc = float(np.sqrt(max(q[second, second] - beta * beta, 0.0)))
    if sc < np.sqrt(EIG_TOL) * max(1.0, np.sqrt(max(q[second, second], 0.0))):
        sc = 0.0
    return first, second, s1, beta, sc


def _safe_ratio(dphi: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """φ′/φ where φ > 0, and 0 where φ = 0 (a zero of a φ ≥ 0, or φ underflowed).

    Every table multiplies (φ′/φ)^β by (tφ)^k with k ≥ β ≥ 1 (a D atom is also one of the k
    normaliser atoms), i.e. it needs t^k φ^{k−β} φ′^β, which is 0 at a zero of φ (a smooth
    φ ≥ 0 has φ′ = 0 there) and negligible where φ underflows; e^{kψ} = 0 there, so any finite
    value is exact, and 0 keeps 0 · (φ′/φ)^β from being 0 · ∞ = NaN.

    >>> _safe_ratio(np.array([0.0, 2.0, 0.0]), np.array([0.0, 1.0, 4.0])).tolist()
    [0.0, 2.0, 0.0]
    """
    out = np.zeros(np.broadcast(dphi, phi).shape)
    np.divide(dphi, phi, out=out, where=np.broadcast_to(phi > 0, out.shape))
    return out
