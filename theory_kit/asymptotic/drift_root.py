"""Fixed points at finite γ: stable roots of the full drift (docs/theory.md §5, §6).

At finite γ the γ² term keeps pumping noise into the keys, so the fixed points are no longer
stationary points of E and there is nothing to minimise.  The fixed point is a root of the
ODE's right-hand side on its own fixed-sample engine (a smooth deterministic map),

    f(y) = dy/dt = 0,   y = (M, the upper triangle of Q, a if trained, b if trained)

(:class:`DriftMap`: untrained a, b would be exact zero rows of the Jacobian), solved by MINPACK
``hybr`` (:func:`solve_drift_root`).  It is stable when every eigenvalue of the Jacobian
J = ∂f/∂y (central differences, :func:`fd_jacobian`) has a negative real part; in (M, Q)
coordinates there is no continuous symmetry left, and the certificate's ``min_eigenvalue`` is
min −Re λ(J).  An unstable root is left along its most unstable eigenvector, by the largest
probe step that keeps Q − M Mᵀ ⪰ 0 (:func:`_displace_admissible`), and an ODE chunk carries
the state away before the next solve.

See Also
--------
theory_kit.asymptotic.certificate : the certificate (kind "stable").
theory_kit.asymptotic.gradient_flow : the fixed points of gradient flow, minima of E.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize

from ..model.state import State
from .certificate import PROBE_STEPS, Certificate, FixedPoint, _drift_tol, _eig_tol, step_scale
from .objectives import DRIFT_TOL, FD_STEP

if TYPE_CHECKING:
    from ..dynamics.ode import OdeSystem


@dataclass
class DriftMap:
    """The ODE's right-hand side as a map of the free coordinates y (finite γ).

    y = (M raveled, upper triangle of Q with its diagonal, a if trained, b if trained): the
    coordinates the drift moves (untrained a, b would be exact zero rows of the Jacobian).
    ``system`` is an ``ode.OdeSystem`` (fixed-sample engine: a smooth deterministic map)."""

    system: OdeSystem
    a0: np.ndarray
    b0: np.ndarray
    train_a: bool
    train_b: bool

    @property
    def H(self) -> int:
        return self.system.H

    def pack(self, state: State) -> np.ndarray:
        iu = np.triu_indices(self.H)
        parts = [state.M.ravel(), state.Q[iu]]
        parts += ([state.a] if self.train_a else []) + ([state.b] if self.train_b else [])
        return np.concatenate(parts)

    def state(self, y: np.ndarray) -> State:
        """The state of y (raises ValidationError when Q − M Mᵀ is not PSD)."""
        return State(*self.arrays(y))

    def drift(self, y: np.ndarray) -> np.ndarray:
        """dy/dt at y (the ODE system raises BlowUpError outside the admissible set)."""
        out = self.system.rhs(0.0, self.system.join(*self.arrays(y)))
        dM, dQ, da, db = self.system.split(out)
        parts = [dM.ravel(), dQ[np.triu_indices(self.H)]]
        parts += ([da] if self.train_a else []) + ([db] if self.train_b else [])
        return np.concatenate(parts)

    def arrays(self, y: np.ndarray) -> tuple:
        """(M, Q, a, b) of y, unchecked."""
        H, F = self.H, self.system.task.F
        k = H * (H + 1) // 2
        Q = np.zeros((H, H))
        Q[np.triu_indices(H)] = y[H * F:H * F + k]
        Q = Q + np.triu(Q, 1).T
        rest = y[H * F + k:]
        a = rest[:H] if self.train_a else self.a0
        b = rest[-H:] if self.train_b else self.b0
        return y[:H * F].reshape(H, F), Q, np.asarray(a, float), np.asarray(b, float)


def fd_jacobian(fun, y: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """∂f/∂y by central differences, shape (dim f, dim y); step h = step·max(1, |y|)."""
    h = step * max(1.0, float(np.linalg.norm(y)))
    cols = [(fun(y + h * e) - fun(y - h * e)) / (2 * h) for e in np.eye(len(y))]
    return np.array(cols).T


def _classify_root(dmap: DriftMap, y: np.ndarray) -> tuple[str, float, float, np.ndarray]:
    """(kind, min −Re λ(J), eig_tol, the most unstable eigenvector's real part)."""
    lam, vecs = np.linalg.eig(fd_jacobian(dmap.drift, y))
    order = np.argsort(-lam.real)
    lam, vecs = lam[order], vecs[:, order]
    etol = _eig_tol(lam.real)
    low = float(-lam[0].real)
    kind = "stable" if low > etol else ("saddle" if low < -etol else "degenerate")
    v = vecs[:, 0].real
    return kind, low, etol, v / max(np.linalg.norm(v), 1e-300)


def _displace_admissible(dmap: DriftMap, y: np.ndarray, v: np.ndarray, advance
                         ) -> np.ndarray | None:
    """y displaced along ±v by the largest probe step that stays admissible, then carried
    on by ``advance``; None when no step works (the saddle is then reported as it is)."""
    scale = step_scale(y)
    for h in PROBE_STEPS:
        for sign in (1.0, -1.0):
            try:
                return dmap.pack(advance(dmap.state(y + sign * h * scale * v)))
            except ValueError:      # outside the admissible set, or the ODE blew up
                continue
    return None


def solve_drift_root(dmap: DriftMap, state: State, advance, tol: float = DRIFT_TOL,
                     max_escapes: int = 2) -> FixedPoint:
    """A stable root of the full drift (γ² term included) near ``state``.

    MINPACK ``hybr`` (``scipy.optimize.root``) on the fixed-sample drift in the coordinates of
    :class:`DriftMap`, then the Jacobian by central differences: every eigenvalue must have
    a negative real part (``kind`` "stable").
    At an unstable root the state is displaced along the most unstable eigenvector (the
    largest probe step that stays admissible, + side first: :func:`_displace_admissible`) and
    ``advance(state) -> state`` (an ODE chunk)
    carries it away before the next solve.  When the solver steps outside the admissible set
    (Q − M Mᵀ not PSD) the start is advanced by one more ODE chunk and the solve retried
    (within the same attempt budget); failing that, "not converged"."""
    start, evals0 = time.perf_counter(), dmap.system.evaluations
    y = dmap.pack(state)
    saddles: list[dict] = []
    kind, low, etol = "not converged", float("nan"), float("nan")
    for attempt in range(max_escapes + 1):
        try:
            res = optimize.root(dmap.drift, y, method="hybr", options={"xtol": 1e-13})
            y_new = res.x
            dmap.state(y_new)
        except ValueError:          # left the admissible set (BlowUpError / ValidationError)
            kind = "not converged"
            try:                    # closer in by one more ODE chunk, then try again
                y = dmap.pack(advance(dmap.state(y)))
            except ValueError:
                break
            continue
        y = y_new
        kind, low, etol, v = _classify_root(dmap, y)
        if kind != "saddle":
            break
        saddles.append({"min_eigenvalue": low, "state": dmap.state(y).to_dict()})
        if attempt < max_escapes:
            moved = _displace_admissible(dmap, y, v, advance)
            if moved is None:
                break
            y = moved
    f = dmap.drift(y)
    st = dmap.state(y)
    kind = {"degenerate": "not converged"}.get(kind, kind)
    err = float(dmap.system.means(0.0, dmap.system.join(*dmap.arrays(y))).error)
    cert = Certificate(float(np.linalg.norm(f)), _drift_tol(y, tol), low, etol, kind, 0)
    return FixedPoint(st, cert, "MINPACK hybr root of the full drift (Jacobian by central "
                      "differences)", err, saddles, dmap.system.evaluations - evals0,
                      time.perf_counter() - start)
