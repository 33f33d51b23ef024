"""The nonlinear continuation of the escape: the map t₁ ↦ τ(t₁) through the full ODE from the
switch amplitude a_s to the threshold δ (issue #14; docs/theory.md §8).

Continuation.  The threshold δ = 0.2 is not infinitesimal, so the escape is *continued*: the
linear process is followed to a switch amplitude a_s < δ (default δ/4), and from there the full
nonlinear ODE is integrated from X_sym(t₁) + v(t₁), v = E[ξ | spread = a_s]/√D of the linear
process (no noise after the switch), giving a deterministic map t₁ ↦ τ(t₁) computed at a few t₁
and interpolated.  With C₂ the second moment of ξ at t₁ and s the leading eigenvector of
L_f C₂ L_fᵀ, v ∝ C₂ L_fᵀ (L_f C₂ L_fᵀ)⁺ s, scaled to spread a_s.  ``switch_dependence`` is the
change of ⟨τ⟩ when a_s is halved.  Measured in Fig. 6's setting the continuation moves ⟨τ₂⟩ by
a few time units only (docs/internals/figure_notes.md), so the linear law is the headline
prediction and the continuation a check of its nonlinear part.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...model.validation import fail
from ..ode import OdeSystem, StepError, StepWatch
from .crossing import first_crossing
from .linearisation import Drift, Linearisation


@dataclass
class EscapeMap:
    """τ(t₁): time the nonlinear ODE from X_sym(t₁) + a_s v(t₁) first has spread > δ."""

    t1: np.ndarray
    tau: np.ndarray
    switch: float
    delta: float
    curve_t: np.ndarray       # the t₁ = 0 solution: times and spreads (for runs that start
    curve_spread: np.ndarray  # above a_s)

    def __call__(self, t1: np.ndarray, start_spread: np.ndarray) -> np.ndarray:
        """τ for linear switch times t₁; runs already above a_s at t = 0 (t₁ = 0) follow the
        t₁ = 0 curve from their own initial spread."""
        t1 = np.asarray(t1, float)
        ok = np.isfinite(self.tau)
        out = np.full(t1.shape, np.inf)
        if ok.any():
            last = self.t1[ok][-1] if not ok.all() else np.inf
            lag = np.interp(t1, self.t1[ok], (self.tau - self.t1)[ok])
            out = np.where(t1 <= last, t1 + lag, np.inf)
        out[~np.isfinite(t1)] = np.inf
        early = (t1 == 0) & (start_spread > self.switch)
        if early.any():
            reach = np.interp(start_spread[early], self.curve_spread, self.curve_t,
                              right=np.inf)
            out[early] = np.where(start_spread[early] >= self.delta, 0.0,
                                  self.tau[0] - reach)
        return out


def escape_direction(lin: Linearisation, second_moment: np.ndarray, f: int, k: int
                     ) -> np.ndarray:
    """E[ξ | L_f ξ = s] at t_k for s along the leading eigenvector of L_f C₂ L_fᵀ: the expected
    linear state given its spread (C₂ L_fᵀ (L_f C₂ L_fᵀ)⁺ s), so the components that grow with
    the spread come along and the ones uncorrelated with it average out."""
    Lf = lin.coords.spread_rows(f)
    C = second_moment[k]
    S = Lf @ C @ Lf.T
    vals, vecs = np.linalg.eigh(S)
    if vals[-1] <= 0:
        fail("direction", "the linear process has no spread along this direction", f + 1)
    return C @ Lf.T @ np.linalg.pinv(S, hermitian=True) @ vecs[:, -1]


def continue_escape(lin: Linearisation, system: OdeSystem, second_moment: np.ndarray, f: int,
                    delta: float, switch: float, t1_nodes: np.ndarray, t_cap: float,
                    dt: float) -> EscapeMap:
    """The nonlinear escape map at the switch times ``t1_nodes`` (RK4 with step dt, at most to
    t_cap)."""
    drift = Drift(system, lin.a0, lin.b0)
    Lf = lin.coords.spread_rows(f)
    taus, curve = [], None
    for t1 in t1_nodes:
        k = int(np.argmin(np.abs(lin.t - t1)))
        v = escape_direction(lin, second_moment, f, k)
        x = lin.x[k] + switch * v / np.linalg.norm(Lf @ v)
        times, spreads = integrate_to_threshold(drift, x, lin.t[k], Lf, delta, t_cap, dt)
        taus.append(first_crossing(times, spreads[None], delta)[0])
        if curve is None:
            curve = (times, spreads)
    assert curve is not None                     # t1_nodes is not empty (``escape_law``)
    return EscapeMap(np.asarray(t1_nodes, float), np.array(taus), switch, delta, *curve)


def integrate_to_threshold(drift: Drift, x: np.ndarray, t0: float, Lf: np.ndarray,
                           delta: float, t_cap: float, dt: float
                           ) -> tuple[np.ndarray, np.ndarray]:
    """RK4 from x at t0 until the spread ‖L_f x‖ exceeds δ or t reaches t_cap; a step that
    does not resolve the dynamics (``ode.StepWatch``) restarts the run with half the step
    (at most :data:`MAP_REFINEMENTS` times; the map step is not a user option)."""
    for _ in range(MAP_REFINEMENTS):
        try:
            return _rk4_to_threshold(drift, x, t0, Lf, delta, t_cap, dt)
        except StepError:
            dt /= 2
    return _rk4_to_threshold(drift, x, t0, Lf, delta, t_cap, dt)


MAP_REFINEMENTS = 6


def _rk4_to_threshold(drift: Drift, x: np.ndarray, t0: float, Lf: np.ndarray, delta: float,
                      t_cap: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
    y = drift.flat(x)
    system, coords = drift.system, drift.coords
    times, spreads = [t0], [float(np.linalg.norm(Lf @ x))]
    t = t0
    watch = StepWatch(system)
    while spreads[-1] <= delta and t < t_cap:
        y = watch.step(t, y, dt)
        t += dt
        M, Q, a, b = system.split(y)
        times.append(t)
        spreads.append(float(np.linalg.norm(Lf @ coords.vector(M, Q, a, b))))
    return np.array(times), np.array(spreads)


def build_map(lin: Linearisation, system: OdeSystem, sampled: list, second: np.ndarray,
              f: int, delta: float, switch: float, n_nodes: int, dt: float) -> EscapeMap:
    """The escape map on ``n_nodes`` switch times spanning those of the samples (from 0)."""
    t1 = np.concatenate([first_crossing(lin.t, s, switch) for _, _, s in sampled])
    t1 = t1[np.isfinite(t1)]
    hi = float(np.max(t1)) if t1.size else float(lin.t[-1])
    nodes = np.unique(np.round(np.linspace(0.0, hi, n_nodes) / (lin.t[1] - lin.t[0]))
                      * (lin.t[1] - lin.t[0]))
    T = float(lin.t[-1])
    # a map run may end after T (a run switching near T crosses later): cap at 1.5 T
    return continue_escape(lin, system, second, f, delta, switch, nodes, 1.5 * T, dt)
