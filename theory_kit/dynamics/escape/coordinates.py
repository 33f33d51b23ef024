"""Coordinates of the escape: the vector x of the order parameters and the head-symmetric state
(issue #14; docs/theory.md §5, §8).

Coordinates.  x = (M raveled, the upper triangle of Q, a if trained, b if trained) ∈ R^n
(:class:`Coordinates`); the drift f(x) is the ODE right-hand side of docs/theory.md §5
(``ode.OdeSystem``, :class:`.linearisation.Drift`).  A head permutation π acts on x by a
permutation matrix P_π (h → π(h) in M, Q, a, b); the average P_sym = mean_π P_π over the group
of ``montecarlo.head_permutations`` is the orthogonal projector onto head-symmetric x, and an
orthonormal basis B of the range of I − P_sym spans the antisymmetric directions, the ones an
escape grows along.  The spread along f is d_f = ‖L_f x‖ with (L_f x)_h = m_{hf} − mean_h' m_{h'f}.

Symmetric state.  The head average of a state, (M, Q, a, b) averaged over the head permutations
(:func:`symmetric_state`), is the start of the reference trajectory X_sym(t): M = 0, Q = η² I
for keys drawn at random; the head average of given overlaps otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...expect.montecarlo import head_permutations
from ...model.state import State
from ..ode import OdeSystem


@dataclass(frozen=True)
class Coordinates:
    """x = (M raveled, Q upper triangle, a if trained, b if trained)."""

    H: int
    F: int
    train_a: bool = False
    train_b: bool = False

    @property
    def n_m(self) -> int:
        return self.H * self.F

    @property
    def n(self) -> int:
        H = self.H
        return self.n_m + H * (H + 1) // 2 + H * (self.train_a + self.train_b)

    def vector(self, M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """x for order parameters with optional leading axes (..., H, F), (..., H, H), (..., H)."""
        iu = np.triu_indices(self.H)
        lead = M.shape[:-2]
        parts = [M.reshape(lead + (-1,)), Q[..., iu[0], iu[1]]]
        if self.train_a:
            parts.append(a)
        if self.train_b:
            parts.append(b)
        return np.concatenate(parts, axis=-1)

    def unpack(self, x: np.ndarray, a0: np.ndarray, b0: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(M, Q, a, b) of one x; untrained scalars are a0, b0."""
        H, i = self.H, self.n_m
        M = x[:i].reshape(H, self.F)
        iu = np.triu_indices(H)
        Q = np.zeros((H, H))
        Q[iu] = x[i:i + len(iu[0])]
        Q = Q + Q.T - np.diag(np.diag(Q))
        i += len(iu[0])
        a = x[i:i + H] if self.train_a else a0
        i += H * self.train_a
        b = x[i:i + H] if self.train_b else b0
        return M, Q, np.asarray(a, float), np.asarray(b, float)

    def permutation(self, perm: tuple[int, ...]) -> np.ndarray:
        """The n × n matrix relabelling the heads h → perm[h] in x."""
        H = self.H
        idx = np.arange(self.n, dtype=float)
        M, Q, a, b = self.unpack(idx, np.zeros(H), np.zeros(H))
        p = list(perm)
        Mp, Qp = M[p], Q[np.ix_(p, p)]
        source = self.vector(Mp, Qp, a[p], b[p]).astype(int)
        P = np.zeros((self.n, self.n))
        P[np.arange(self.n), source] = 1.0
        return P

    def symmetric_projector(self) -> np.ndarray:
        """Average of the head permutations of ``montecarlo.head_permutations`` (a group):
        the orthogonal projector onto head-symmetric x."""
        return np.mean([self.permutation(p) for p in head_permutations(self.H)], axis=0)

    def antisymmetric_basis(self) -> np.ndarray:
        """Orthonormal basis (n × k) of the complement of the head-symmetric subspace."""
        vals, vecs = np.linalg.eigh(np.eye(self.n) - self.symmetric_projector())
        return vecs[:, vals > 0.5]

    def spread_rows(self, f: int) -> np.ndarray:
        """L_f (H × n): (L_f x)_h = m_{hf} − mean_h' m_{h'f}, so d_f = ‖L_f x‖."""
        L = np.zeros((self.H, self.n))
        cols = np.arange(self.H) * self.F + f
        L[:, cols] = np.eye(self.H) - 1.0 / self.H
        return L


def coordinates_for(system: OdeSystem) -> Coordinates:
    """The coordinates of an ODE system (trained scalars have a non-zero rate)."""
    return Coordinates(system.H, system.task.F, system.rate_a != 0, system.rate_b != 0)


def symmetric_state(state: State) -> State:
    """The head average of a state (over ``montecarlo.head_permutations``)."""
    perms = head_permutations(state.H)
    M = np.mean([state.M[list(p)] for p in perms], axis=0)
    Q = np.mean([state.Q[np.ix_(list(p), list(p))] for p in perms], axis=0)
    a = np.mean([state.a[list(p)] for p in perms], axis=0)
    b = np.mean([state.b[list(p)] for p in perms], axis=0)
    return State(M, Q, a, b)
