"""The deterministic E: the objective of the polish, without samples (docs/theory.md §6).

:class:`PairwiseError` is E(K, a, b) of a per-head activation with its exact gradient from the
pairwise decomposition into 1- and 2-head sub-models on the Laplace engine
(``expect.pairwise``),

    E = Σ_{h<h'} E_2(h, h') − (H − 2) Σ_h E_1(h) + c_H (1 + Δ),

in the coordinates of ``objectives.KeySpace`` (K = [M | P], Q = K Kᵀ).  There is nothing for
the keys to fit, so a descent on it cannot run off into a sample artefact.  What the
deterministic objectives share (:class:`DeterministicError`; the joint normalisers' one is
``laplace_objective.LaplaceError``): a fixed resolution ``level`` (a smooth function for
L-BFGS and finite differences), a coarser ``descent_level`` for the long way down, the finer
levels where the certificate may need Newton to continue, and the key cap: beyond
|k_h| = ``KEY_CAP`` the objective is the continuous extension (:class:`KeyCap`)

    E(clip(K)) + ½ Σ_h (|k_h| − cap)₊²,

never an evaluation of the engine there.  The Hessian is taken head by head
(:func:`head_local_hessian`): column i differences only the sub-models that contain the head
of coordinate i.

:class:`ZeroOrthogonal` is the face P = 0 of key space (x_r = (M, a, b), K = [M | 0]).  E
depends on P only through P Pᵀ, so at P = 0 the gradient along P and the mixed derivatives
∂²E/∂M∂P vanish and the P-block of the Hessian is 2 G_Q ⊗ I_H, G_Q = ∂E/∂Q: a minimum on the
face with 2 G_Q ≻ 0 is a minimum of the full space, with no gauge zero modes.

See Also
--------
theory_kit.expect.pairwise : the decomposition and its error estimates.
theory_kit.asymptotic.gradient_flow : ``polish_gradient_flow``, the minimisation on it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..io.progress import tick
from ..model.activations import Activation
from ..model.state import State
from ..model.task import Task
from .objectives import DRIFT_TOL, FD_STEP, KeySpace, max_key_norm

if TYPE_CHECKING:
    from ..expect.pairwise import PairwiseLaplace

# The deterministic E is evaluated only for key norms |k_h| ≤ KEY_CAP: the Laplace grids of a
# pair grow like |k|⁴ (softmax, F = 4, ν = 10, level 0.5: 0.29 GB and 0.3 CPU s at |k| = 3,
# 0.65 GB and 1.9 s at |k| = 10, > 10 GB at |k| = 20; two polishes of H = 8 seed 1 were
# killed at 21 GB when an L-BFGS line search tried such keys).  The certified minima have
# |k| ≤ 6.04 (H = 8, seed 0).
KEY_CAP = 10.0


class KeyCap:
    """The continuous extension of a function of keys K (rows k_h) beyond ``KEY_CAP``:
    f(clip(K)) + ½ Σ_h (|k_h| − cap)₊², clip scaling each row beyond the cap back onto it.  A
    line search may try such keys; the deterministic engines are never evaluated there."""

    def __init__(self, K: np.ndarray) -> None:
        self.norms = np.linalg.norm(K, axis=1)
        self.over = self.norms > KEY_CAP
        self.scale = np.where(self.over, KEY_CAP / np.maximum(self.norms, 1e-300), 1.0)
        self.unit = K / np.maximum(self.norms, 1e-300)[:, None]
        self.excess = np.where(self.over, self.norms - KEY_CAP, 0.0)
        self.clipped = K * self.scale[:, None]

    def value(self, value: float) -> float:
        """f(clip(K)) plus the penalty."""
        return value + 0.5 * float(np.sum(self.excess ** 2))

    def gradient(self, dK: np.ndarray) -> np.ndarray:
        """∂/∂K of the extension from ∂f/∂K at clip(K): d clip = (cap/|k|)(I − k̂k̂ᵀ) on the
        rows beyond the cap, plus the penalty's (|k| − cap) k̂."""
        if not np.any(self.over):
            return dK
        radial = np.sum(dK * self.unit, axis=1)
        return (self.scale[:, None] * (dK - np.where(self.over, radial, 0.0)[:, None]
                                       * self.unit) + self.excess[:, None] * self.unit)


@dataclass
class DeterministicError(KeySpace):
    """What the deterministic objectives share: a fixed resolution ``level`` for
    ``value_and_grad`` (a smooth function, for L-BFGS and finite differences), a coarser
    ``descent_level`` for the long way down, the finer ``finer_levels`` where the certificate
    may need Newton to continue (:func:`gradient_flow._at_finer_levels`), and the key cap."""

    level: float | None = None
    descent_level: float | None = None
    evaluations: int = field(default=0, init=False)

    @contextlib.contextmanager
    def at_level(self, level: float | None):
        """``level`` set to ``level`` inside the block."""
        fine = self.level
        self.level = level
        try:
            yield self
        finally:
            self.level = fine

    def at_descent_level(self):
        """``level`` set to ``descent_level`` inside the block (an inexact-Newton schedule:
        L-BFGS far from the minimum needs ~1e-6 in the gradient, not 1e-14)."""
        return self.at_level(self.descent_level)

    def finer_levels(self) -> list[float]:
        """The resolutions above ``level`` that :meth:`evaluate` may certify at."""
        raise NotImplementedError

    def beyond_cap(self, x: np.ndarray) -> bool:
        """Whether a head's key norm exceeds ``KEY_CAP`` (there E is not evaluated)."""
        return max_key_norm(self, x) > KEY_CAP

    def error_at(self, state: State, level: float | None = None) -> float:
        """E at ``state`` at the fixed resolution ``level`` (default: the objective's)."""
        with self.at_level(self.level if level is None else level):
            return self.value_and_grad(self.pack_state(state))[0]


@dataclass
class PairwiseError(DeterministicError):
    """E(K, a, b) and its gradient by the deterministic engine: the pairwise decomposition of
    a per-head activation into 1- and 2-head sub-models on the Laplace engine
    (``expect.pairwise``).  Same coordinates as :class:`objectives.SampledError`, no samples:
    there is nothing for the keys to fit, so a descent on it cannot run off into a sample
    artefact.

    ``value_and_grad`` works at one fixed resolution ``level`` (a smooth function, for L-BFGS
    and finite differences); :meth:`evaluate` adds the error estimates (``Fields.value_err``,
    ``grad_err``).  ``hessian`` differentiates the gradient per coordinate and recomputes only
    the sub-models that contain that coordinate's head (H − 1 pairs and one single of the
    H(H−1)/2 + H), bit for bit the same columns as differencing the whole gradient."""

    engine: PairwiseLaplace = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from ..expect import pairwise  # imports the Laplace engine (numba)
        self.engine = pairwise.PairwiseLaplace(self.task, self.act, self.H)
        if self.level is None:
            self.level = pairwise.DEFAULT_LEVEL
        if self.descent_level is None:
            self.descent_level = pairwise.DESCENT_LEVEL

    def finer_levels(self) -> list[float]:
        from ..expect.pairwise import LEVELS
        assert self.level is not None            # set in __post_init__
        return [lv for lv in LEVELS if lv > self.level]

    @classmethod
    def for_activation(cls, task: Task, act: Activation, H: int) -> "PairwiseError":
        """The objective with the activation's default a, b and training flags."""
        return cls(task, act, H, act.a_default(H, task.L), act.b_default(H, task.L),
                   act.train_a, act.train_b)

    @property
    def n(self) -> str:
        """What the solver records as its points: none (deterministic)."""
        return "pairwise laplace"

    def _pack_fields(self, f) -> np.ndarray:
        return self.pack(f.dK, f.da, f.db)

    def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """(E, ∂E/∂x) at the fixed resolution ``level``; beyond the key cap (:meth:`beyond_cap`)
        the continuous extension E(clip(x)) + ½ Σ_h (|k_h| − cap)², clip scaling each head
        beyond the cap back onto it (a line search may try such points; E itself is never
        evaluated there)."""
        self.evaluations += 1
        tick()
        K, a, b = self.unpack(x)
        cap = KeyCap(K)
        assert self.level is not None            # set in __post_init__
        f = self.engine.fields(cap.clipped, a, b, level=self.level)
        return cap.value(f.value), self.pack(cap.gradient(f.dK), f.da, f.db)

    def evaluate(self, x: np.ndarray, tol: float = DRIFT_TOL) -> tuple[float, float, np.ndarray,
                                                                      float]:
        """(E, abs_err of E, ∂E/∂x, ‖abs_err of ∂E/∂x‖) from two resolutions
        (``PairwiseLaplace.evaluate``, its gradient error over the coordinates of x)."""
        f = self.engine.evaluate(*self.unpack(x), tol=tol, counted=self.pack)
        return f.value, f.value_err, self._pack_fields(f), f.grad_err

    def head_of(self, i: int) -> int:
        """The head that coordinate i of x belongs to."""
        width = self.task.F + self.H
        return i // width if i < self.H * width else self.scalar_head(i - self.H * width)

    def hessian(self, x: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, float]:
        """(Zᵀ ∇²E Z, its finite-difference error): central differences of the exact gradient
        per coordinate (step h = FD_STEP·max(1, ‖x‖)), each column from the sub-models of its
        head only (class docstring).  The error stated is the asymmetry max |∇²E − ∇²Eᵀ| of
        the full matrix before it is symmetrised (the columns are independent differences, so
        it measures their truncation and rounding), projected: ≤ that × ‖Z‖² = that."""
        self.evaluations += 2 * len(x)
        return head_local_hessian(self.partial_grad, self.head_of, x, Z)

    def partial_grad(self, x: np.ndarray, head: int) -> np.ndarray:
        """∂/∂x of the decomposition's terms that involve ``head`` (fixed resolution)."""
        assert self.level is not None            # set in __post_init__
        return self._pack_fields(self.engine.fields(*self.unpack(x), level=self.level,
                                                    heads=[head]))


class ZeroOrthogonal:
    """The deterministic E on the face P = 0 of key space: coordinates x_r = (M, a if trained,
    b if trained), keys K = [M | 0], Q = M Mᵀ.

    Why: E depends on P only through P Pᵀ, so at P = 0 the gradient along P vanishes exactly,
    the mixed second derivatives ∂²E/∂M∂P vanish, and the P-block of the Hessian is
    2 G_Q ⊗ I_H with G_Q = ∂E/∂Q (symmetric, at Q = M Mᵀ).  A stationary point of E restricted
    to the face whose M-Hessian and 2 G_Q are both positive is therefore a local minimum of E
    in the full key space, with no gauge zero modes (the orbit [0 | 0 · R] is a point).  The
    face has H·F coordinates instead of H·(F+H) (32 against 96 at H = 8, F = 4), so descent
    and Hessian cost ~3x less; gradient flow drives the orthogonal parts to 0 at the minima
    measured (softmax, F = 2 and 4: Q − M Mᵀ = 0 to round-off)."""

    def __init__(self, full: PairwiseError) -> None:
        self.full = full
        self.H, self.task = full.H, full.task
        self.train_a, self.train_b = full.train_a, full.train_b

    @property
    def evaluations(self) -> int:
        return self.full.evaluations

    @property
    def n(self) -> str:
        return self.full.n + " (P = 0)"

    @property
    def dim(self) -> int:
        return self.full.dim - self.H * self.H        # the full space without P

    def embed(self, xr: np.ndarray) -> np.ndarray:
        """The full key-space vector of x_r (K = [M | 0])."""
        F, H = self.task.F, self.H
        K = np.hstack([xr[:H * F].reshape(H, F), np.zeros((H, H))])
        return self.full.pack(K, *self.full.scalars(xr[H * F:]))

    def restrict(self, g: np.ndarray) -> np.ndarray:
        """The face's components of a full key-space vector (drops the P part)."""
        K, a, b = self.full.unpack(g)
        return self.full.pack(K[:, :self.task.F], a, b)

    def value_and_grad(self, xr: np.ndarray) -> tuple[float, np.ndarray]:
        v, g = self.full.value_and_grad(self.embed(xr))
        return v, self.restrict(g)

    def beyond_cap(self, xr: np.ndarray) -> bool:
        return self.full.beyond_cap(self.embed(xr))

    def state(self, xr: np.ndarray) -> State:
        return self.full.state(self.embed(xr))

    def head_of(self, i: int) -> int:
        F, H = self.task.F, self.H
        return i // F if i < H * F else self.full.scalar_head(i - H * F)

    def quotient(self, xr: np.ndarray) -> np.ndarray:
        return np.eye(self.dim)

    def hessian(self, xr: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, float]:
        """The face's Hessian (head-local differences, :func:`head_local_hessian`)."""
        self.full.evaluations += 2 * len(xr)
        return head_local_hessian(
            lambda y, h: self.restrict(self.full.partial_grad(self.embed(y), h)),
            self.head_of, xr, Z)

    def orthogonal_curvature(self, xr: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(eigenvalues, eigenvectors, finite-difference error) of 2 G_Q, the Hessian's P-block
        (class docstring): column h from ±ε of head h's orthogonal part along one direction,
        ∂E/∂P = 2 G_Q P, differenced with head h's terms only; error = the asymmetry."""
        x = self.embed(xr)
        F, H = self.task.F, self.H
        eps = FD_STEP * max(1.0, float(np.linalg.norm(x)))
        cols = []
        for h in range(H):
            parts = []
            for sign in (1.0, -1.0):
                K, a, b = self.full.unpack(x.copy())
                K[h, F] = sign * eps
                parts.append(self.full.unpack(self.full.partial_grad(self.full.pack(K, a, b),
                                                                     h))[0][:, F])
            cols.append((parts[0] - parts[1]) / (2 * eps))
        self.full.evaluations += 2 * H
        G2 = np.array(cols).T
        fd_err = float(np.max(np.abs(G2 - G2.T)))
        eigs, vecs = np.linalg.eigh(0.5 * (G2 + G2.T))
        return eigs, vecs, fd_err

    def orthogonal_direction(self, v: np.ndarray) -> np.ndarray:
        """The unit full-space direction δP = v e_1ᵀ (the heads' orthogonal parts along one
        axis, weights v), scalars unchanged."""
        K = np.zeros((self.H, self.task.F + self.H))
        K[:, self.task.F] = v
        zero = np.zeros(self.H)
        y = self.full.pack(K, zero, zero)
        return y / np.linalg.norm(y)


def head_local_hessian(partial_grad, head_of, x: np.ndarray, Z: np.ndarray
                       ) -> tuple[np.ndarray, float]:
    """(Zᵀ ∇²E Z, finite-difference error) by central differences per coordinate i (step
    h = FD_STEP·max(1, ‖x‖)) of ``partial_grad(y, head_of(i))``, the gradient of the terms that
    involve i's head (the others cancel exactly).  The error stated is the asymmetry
    max |∇²E − ∇²Eᵀ| of the matrix before it is symmetrised (independent differences per
    column, so it measures their truncation and rounding); ‖Z‖ = 1 keeps it a bound."""
    h = FD_STEP * max(1.0, float(np.linalg.norm(x)))
    cols = []
    for i in range(len(x)):
        e = np.zeros(len(x))
        e[i] = h
        part = [partial_grad(y, head_of(i)) for y in (x + e, x - e)]
        cols.append((part[0] - part[1]) / (2 * h))
    full = np.array(cols).T
    fd_err = float(np.max(np.abs(full - full.T)))
    full = 0.5 * (full + full.T)
    return Z.T @ full @ Z, fd_err
