"""E(K, a, b) and its exact gradient from the deterministic drift engine, for the fixed-point
polish of activations the pairwise decomposition does not cover: joint normalisers with
H ≤ 3 (B-softmax; ``expect.laplace``'s class), docs/theory.md §6.

The engine gives at (M, Q, a, b) the gradient-flow drift dM, dQ_lin, da, db and E (§5).  In
the solver's coordinates K = [M | P], Q = K Kᵀ, gradient flow is dK/dτ = −½ ∂E/∂K, so

    ∂E/∂K = −2 [dM | dP],   dP = −A P,   ∂E/∂a = −2 da,   ∂E/∂b = −2 db,

with A the symmetric ∂E/∂Q.  dQ_lin = dK Kᵀ + K dKᵀ gives A C + C A = R with C = P Pᵀ and
R = dM Mᵀ + M dMᵀ − dQ_lin.  With P = V √Λ Wᵀ (SVD; C = V Λ Vᵀ), A P = V [R̃_ij √λ_j /
(λ_i + λ_j)] Wᵀ, R̃ = Vᵀ R V: every entry with λ_j = 0 vanishes, so the part of A that dQ_lin
leaves undetermined (directions where P has no extent) never enters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..expect.laplace import COARSE, LaplaceDrift, applicability
from .deterministic import DeterministicError
from .objectives import DRIFT_TOL, fd_columns

# The resolutions: the drift's cost grows steeply with level and key norm (B-softmax, F = 4,
# ν = 10, L = 5, H = 2, |k| = 4.5: 7 CPU s at 0.5625, 42 at 1.0, loaded), so the polish works
# at the pairwise polish's 0.5625 and the certificate climbs this ladder (each rung against
# rung × COARSE) only as far as its errors ask.
LEVELS = (0.5625, 0.75, 1.0)
DESCENT_LEVEL = 0.5625 * COARSE


def applies(task, act, H: int) -> bool:
    """Whether the drift engine covers (task, act, H)."""
    return applicability(task, act, H)[0]


def key_gradient(K: np.ndarray, F: int, fields: dict) -> np.ndarray:
    """∂E/∂K (H × (F + H)) from the drift fields (module docstring)."""
    M, P = K[:, :F], K[:, F:]
    dM, dQ = np.asarray(fields["dM"]), np.asarray(fields["dQ_lin"])
    R = dM @ M.T + M @ dM.T - dQ
    V, sv, Wt = np.linalg.svd(P)
    lam = sv ** 2
    denom = lam[:, None] + lam[None, :]
    Rt = V.T @ R @ V
    with np.errstate(invalid="ignore", divide="ignore"):
        AP = np.where(denom > 0, Rt * np.sqrt(lam)[None, :] / denom, 0.0)
    dP = -(V @ AP @ Wt)
    return -2.0 * np.hstack([dM, dP])


@dataclass
class LaplaceError(DeterministicError):
    """E and ∂E/∂x (x as :class:`objectives.KeySpace`) on the Laplace drift engine at one
    resolution (``value_and_grad``), with abs_err from the next coarser one (``evaluate``);
    the Hessian by central differences of the gradient, its error the asymmetry."""

    engine: LaplaceDrift = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.engine = LaplaceDrift()
        if self.level is None:
            self.level = LEVELS[0]
        if self.descent_level is None:
            self.descent_level = DESCENT_LEVEL

    @property
    def n(self) -> str:
        return "laplace drift"

    def finer_levels(self) -> list[float]:
        assert self.level is not None            # set in __post_init__
        return [lv for lv in LEVELS if lv > self.level]

    def _fields(self, x: np.ndarray, level: float) -> tuple[dict, float]:
        K, a, b = self.unpack(x)
        M, Q = K[:, :self.task.F], K @ K.T
        v, defect = self.engine.checked(self.task, self.act, M, Q, a, b, level)
        return self.engine.unpack(self.task, self.act, M, Q, v), defect

    def _grad(self, x: np.ndarray, fields: dict) -> np.ndarray:
        K = self.unpack(x)[0]
        return self.pack(key_gradient(K, self.task.F, fields), -2.0 * fields["da"],
                         -2.0 * fields["db"])

    def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """(E, ∂E/∂x) at the fixed resolution ``level``."""
        self.evaluations += 1
        assert self.level is not None            # set in __post_init__
        fields, _ = self._fields(x, self.level)
        return float(fields["error"]), self._grad(x, fields)

    def partial_grad(self, x: np.ndarray, head: int) -> np.ndarray:
        """The whole gradient at ``level`` (the drift engine has no per-head terms): what the
        face P = 0 (``deterministic.ZeroOrthogonal``) differences for its Hessian and for the
        curvature 2 ∂E/∂Q of its orthogonal block."""
        del head
        return self.value_and_grad(x)[1]

    def evaluate(self, x: np.ndarray, tol: float = DRIFT_TOL
                 ) -> tuple[float, float, np.ndarray, float]:
        """(E, abs_err, ∂E/∂x, ‖abs_err of ∂E/∂x‖): at ``level`` and each finer one of
        ``LEVELS`` in turn against level × COARSE, the first whose errors are below ``tol``
        (else the finest); errors floored by the mass defect as the drift engine's."""
        below = None                # (level, fields) of the rung below: its coarse partner
        assert self.level is not None            # set in __post_init__
        for level in [self.level] + self.finer_levels():
            if below is not None and np.isclose(below[0], level * COARSE, rtol=1e-12):
                coarse = below[1]
            else:
                self.evaluations += 1
                coarse = self._fields(x, level * COARSE)[0]
            self.evaluations += 1
            fine, defect = self._fields(x, level)
            below = (level, fine)
            g_fine, g_coarse = self._grad(x, fine), self._grad(x, coarse)
            floor = max(64 * np.finfo(float).eps, defect)
            value_err = max(abs(fine["error"] - coarse["error"]),
                            floor * max(1.0, abs(fine["error"])))
            grad_err = max(float(np.linalg.norm(g_fine - g_coarse)),
                           floor * max(1.0, float(np.max(np.abs(g_fine)))))
            if max(value_err, grad_err) < tol:
                break
        return float(fine["error"]), value_err, g_fine, grad_err

    def hessian(self, x: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, float]:
        """(Zᵀ ∇²E Z, its error): central differences of the gradient, symmetrised; the error
        is the asymmetry before that."""
        self.evaluations += 2 * Z.shape[1]
        Hq = fd_columns(lambda y: self.value_and_grad(y)[1], x, Z)
        return 0.5 * (Hq + Hq.T), float(np.max(np.abs(Hq - Hq.T))) if Hq.size else 0.0
