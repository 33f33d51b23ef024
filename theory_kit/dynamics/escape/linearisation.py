"""The linearisation along the head-symmetric trajectory: the drift f(x), its Jacobian J(t), the
growth rate λ(t) and X_sym(t), J, Σ, Φ on one time grid (issue #14; docs/theory.md §5, §8).

Reference trajectory.  X_sym(t) solves the ODE from a head-symmetric start (M = 0, Q = η² I
for keys drawn at random; the head average of given overlaps otherwise).  With a
head-equivariant drift engine (sample sets paired with their head permutations) it stays
exactly symmetric, so every head spread is zero along it.

Linearisation.  J(t) = ∂f/∂x at X_sym(t), by central differences of a fixed-sample engine
(a smooth function of x): J_ij ≈ [f(x + h e_j) − f(x − h e_j)]/2h, truncation O(h² f''')
and rounding O(ε|f|/h); ``fd_err`` compares h with 2h.  The Sobol sampling error of J (the
dominant one) is estimated by repeating J with a quarter of the points (``sampling_err``).
Along X_sym the antisymmetric block Bᵀ J B (B an orthonormal basis of the complement of the
head-permutation-invariant subspace) has the leading growth rate λ(t) = max Re eig; Φ(t)
solves dΦ/dt = J Φ, Φ(0) = I.

J and the noise covariance Σ (:mod:`.fluctuations`) are computed at the nodes of
:func:`jacobian_nodes` and interpolated linearly in t; the step must resolve them,
dt·ρ(J) ≤ :data:`MAX_STEP_RATE` at every node (ρ the spectral radius).  A
:class:`Linearisation` propagates the moments of the linear process from ξ(0):
E ξ(t_{k+1}) = A_k E ξ(t_k) and Cov ξ(t_{k+1}) = A_k Cov ξ(t_k) A_kᵀ + Q_k.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ... import __version__
from ...expect.drift import QuadratureDrift, SampleDrift
from ...expect.engines import build_engine
from ...io.progress import progress_bar
from ...model.activations import Activation
from ...model.initial import InitialCondition
from ...model.state import State
from ...model.task import Task
from ...model.validation import as_finite_array, fail
from ..ode import OdeSystem, build_system, integrate_ode
from .coordinates import Coordinates, coordinates_for, symmetric_state
from .fluctuations import noise_covariance, propagators

FD_STEP = 1e-4


class Drift:
    """f(x) = dx/dt of an :class:`ode.OdeSystem` in the coordinates x (untrained a, b fixed)."""

    def __init__(self, system: OdeSystem, a0: np.ndarray, b0: np.ndarray) -> None:
        self.system, self.a0, self.b0 = system, np.asarray(a0, float), np.asarray(b0, float)
        self.coords = coordinates_for(system)

    def flat(self, x: np.ndarray) -> np.ndarray:
        """The OdeSystem's flat vector (M, Q, a, b) for x."""
        return self.system.join(*self.coords.unpack(x, self.a0, self.b0))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        M, Q, a, b = self.system.split(self.system.rhs(0.0, self.flat(x)))
        return self.coords.vector(M, Q, a, b)


def jacobian(drift: Drift, x: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """∂f/∂x (n × n) by central differences with step h = ``step``."""
    n = len(x)
    J = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = step
        J[:, j] = (drift(x + e) - drift(x - e)) / (2 * step)
    return J


def growth_rate(J: np.ndarray, basis: np.ndarray) -> float:
    """max Re eig(Bᵀ J B): the leading rate of the block on span(B)."""
    return float(np.max(np.linalg.eigvals(basis.T @ J @ basis).real))


@dataclass
class Linearisation:
    """The symmetric trajectory and its linearisation on the grid t (nt,).

    x (nt, n): X_sym; J (nt, n, n) interpolated from the nodes ``jac_t``; Sigma (nt, n, n)
    likewise; A (nt−1, n, n) one-step propagators e^{J h}; Qstep (nt−1, n, n) one-step noise
    covariances; Phi (nt, n, n); lam (nt,) the antisymmetric growth rate."""

    t: np.ndarray
    x: np.ndarray
    J: np.ndarray
    Sigma: np.ndarray
    A: np.ndarray
    Qstep: np.ndarray
    Phi: np.ndarray
    lam: np.ndarray
    jac_t: np.ndarray
    coords: Coordinates
    a0: np.ndarray
    b0: np.ndarray
    errors: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    def covariance(self, C0: np.ndarray) -> np.ndarray:
        """Cov ξ(t) (nt, n, n) of the linear process from Cov ξ(0) = C0."""
        C = np.empty((len(self.t),) + C0.shape)
        C[0] = C0
        for k in range(len(self.t) - 1):
            C[k + 1] = self.A[k] @ C[k] @ self.A[k].T + self.Qstep[k]
        return C

    def mean(self, xi0: np.ndarray) -> np.ndarray:
        """E ξ(t) (nt, n) from a given ξ(0)."""
        mu = np.empty((len(self.t), len(xi0)))
        mu[0] = xi0
        for k in range(len(self.t) - 1):
            mu[k + 1] = self.A[k] @ mu[k]
        return mu

    def to_dict(self) -> dict:
        return {"t": self.t, "x_sym": self.x, "J": self.J, "Sigma": self.Sigma, "Phi": self.Phi,
                "lambda": self.lam, "jacobian_times": self.jac_t, "errors": self.errors,
                "params": self.params}


def default_engine(n_points: int = 4096, seed: int = 1) -> SampleDrift:
    """Scrambled Sobol points paired with their head permutations: an exactly head-equivariant,
    smooth drift (so X_sym stays symmetric and J has exact block structure)."""
    # "sobol" builds a sample engine (``engines.sample_engine``)
    return cast(SampleDrift, build_engine("sobol", samples=n_points, seed=seed,
                                          head_symmetric=True))


def jacobian_nodes(T: float, dt: float, every: float) -> np.ndarray:
    """Times of the Jacobian/noise nodes: every dt up to 10 (the fast transient), then every
    ``every``, always including T (all on the dt grid)."""
    early = np.arange(0.0, min(10.0, T) + 1e-9, max(dt, 2.0))
    late = np.arange(early[-1], T + 1e-9, every)
    return np.unique(np.round(np.concatenate([early, late, [T]]) / dt) * dt)


def linearise(task: Task, act: Activation, start: State, gamma: float, T: float,
              engine: SampleDrift | None = None, dt: float = 2.0, every: float = 10.0,
              noise_samples: int = 65536, seed: int = 0, check_points: int | None = 1024,
              train_a: bool | None = None, train_b: bool | None = None,
              gamma_a: float | None = None, gamma_b: float | None = None,
              progress: bool = True) -> Linearisation:
    """X_sym from the head-symmetric ``start`` (RK4 with step dt, recorded every dt), J and Σ at
    the nodes of :func:`jacobian_nodes`, interpolated linearly in t, the propagators, Φ and λ.

    ``check_points``: repeat J at the node nearest T/2 with that many Sobol points (the engine's
    default has 4096) to estimate the sampling error of λ (None: skip)."""
    engine = default_engine() if engine is None else engine
    dt = float(as_finite_array(dt, "dt"))
    if dt <= 0:
        fail("dt", "must be > 0", dt)
    sym = symmetric_state(start)
    n_t = int(round(T / dt))
    if n_t < 2 or abs(n_t * dt - T) > 1e-9 * T:
        fail("T", f"must be a multiple (>= 2) of dt = {dt:g}", T)
    system, rates = build_system(task, act, sym.H, engine, gamma, train_a, train_b, gamma_a,
                                 gamma_b, False, False)
    drift = Drift(system, sym.a, sym.b)
    coords = drift.coords
    x_start = coords.vector(sym.M, sym.Q, sym.a, sym.b)
    check_step_rate(jacobian(drift, x_start)[None], np.zeros(1), dt, rates["gamma"])
    t = np.linspace(0.0, T, n_t + 1)
    traj = integrate_ode(task, act, InitialCondition(sym), gamma, T, times=t, dt=dt,
                         engine=engine, train_a=train_a, train_b=train_b, gamma_a=gamma_a,
                         gamma_b=gamma_b, progress=progress)
    x = coords.vector(traj.M, traj.Q, traj.a, traj.b)
    nodes = jacobian_nodes(T, dt, every)
    idx = np.searchsorted(t, nodes - 1e-9)
    step_rates = (rates["gamma"], rates["gamma_a"] * rates["train_a"],
                  rates["gamma_b"] * rates["train_b"])
    bar = progress_bar(len(idx), "escape: Jacobian and noise", unit="node") if progress else None
    Jn_rows: list[np.ndarray] = []
    Sn_rows: list[np.ndarray] = []
    Sse: list[np.ndarray] = []
    for k, i in enumerate(idx):
        Jn_rows.append(jacobian(drift, x[i]))
        S, se, _ = noise_covariance(task, act, coords, traj.state(i), step_rates, noise_samples,
                                    seed=seed + k)
        Sn_rows.append(S)
        Sse.append(se)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    Jn, Sn = np.array(Jn_rows), np.array(Sn_rows)
    check_step_rate(Jn, t[idx], dt, rates["gamma"])
    J, Sigma = interpolate_nodes(t, t[idx], Jn), interpolate_nodes(t, t[idx], Sn)
    A, Qstep, Phi = propagators(t, J, Sigma)
    basis = coords.antisymmetric_basis()
    lam = np.array([growth_rate(Jk, basis) for Jk in J])
    errors = node_errors(drift, x, idx, Jn, basis, task, act, gamma, check_points, engine)
    errors["sigma_rel_se"] = float(np.max(np.array(Sse)) / max(np.max(np.abs(Sn)), 1e-300))
    params = {"task": task.params(), "activation": act.params(), "start": sym.to_dict(),
              **rates, "T": T, "dt": dt, "jacobian_every": every, "noise_samples": noise_samples,
              "seed": seed, "engine": engine.params(), "fd_step": FD_STEP, "version": __version__}
    return Linearisation(t, x, J, Sigma, A, Qstep, Phi, lam, t[idx], coords, sym.a, sym.b,
                         errors, params)


# dt·ρ(J) allowed along the linearisation (stricter than the RK4 stability limit of
# ode.MAX_STEP_RATE: the noise steps are an O(h²) expansion); Fig. 11's plan (dt = 5) has 1.28
MAX_STEP_RATE = 1.5


def check_step_rate(J: np.ndarray, times: np.ndarray, dt: float, gamma: float) -> None:
    """Refuse a step dt that does not resolve the linearisation: dt·ρ(J) over
    :data:`MAX_STEP_RATE` at any node (ρ the spectral radius; J (k, n, n) at ``times``).
    The RK4 trajectory, the O(h²) noise covariances of :func:`propagators` and the
    interpolation of J between nodes all need it (``--gamma 1e3`` with dt = 2 has
    dt·ρ ≈ 120 at t = 0, and printed a law of τ made of nulls)."""
    with np.errstate(all="ignore"):
        radius = np.array([np.max(np.abs(np.linalg.eigvals(Jk))) if np.all(np.isfinite(Jk))
                           else np.inf for Jk in J])
    worst = int(np.argmax(radius))
    rate = dt * float(radius[worst])
    if not rate <= MAX_STEP_RATE:
        allowed = (f"<= {MAX_STEP_RATE / radius[worst]:.3g}" if np.isfinite(rate)
                   else "much smaller")
        fail("dt", f"must be {allowed} at this gamma (or use a smaller gamma): "
             "the step does not resolve the "
             f"dynamics at t = {times[worst]:.4g}, where the fastest rate of the Jacobian is "
             f"{radius[worst]:.3g} at gamma = {gamma:g} (dt x rate = {rate:.3g} > "
             f"{MAX_STEP_RATE:g})", dt)


def interpolate_nodes(t: np.ndarray, nodes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation in t of matrices given at the nodes."""
    flat = values.reshape(len(nodes), -1)
    out = np.stack([np.interp(t, nodes, flat[:, j]) for j in range(flat.shape[1])], axis=1)
    return out.reshape((len(t),) + values.shape[1:])


def node_errors(drift: Drift, x: np.ndarray, idx: np.ndarray, Jn: np.ndarray,
                basis: np.ndarray, task: Task, act: Activation, gamma: float,
                check_points: int | None, engine: SampleDrift) -> dict:
    """Error estimates of λ at the middle node: finite differences (h against 2h) and, with
    ``check_points``, the Sobol sampling error (|λ_N − λ_{N/4}|-type difference against an
    engine with ``check_points`` points; reported as is, a conservative estimate)."""
    mid = len(idx) // 2
    xm = x[idx[mid]]
    lam = growth_rate(Jn[mid], basis)
    out = {"node_t_index": int(idx[mid]), "lambda_mid": lam,
           "fd_err": abs(growth_rate(jacobian(drift, xm, 2 * FD_STEP), basis) - lam) / 3}
    if check_points is not None and isinstance(engine, QuadratureDrift) \
            and engine.max_tensor_dim == 1:
        coarse = build_engine("sobol", samples=check_points, seed=engine.seed,
                              head_symmetric=engine.head_symmetric)
        system = drift.system
        other = OdeSystem(system.task, system.act, coarse, system.H, system.rate,
                          system.noise_rate, system.rate_a, system.rate_b)
        lam_c = growth_rate(jacobian(Drift(other, drift.a0, drift.b0), xm), basis)
        out["sampling_err"] = abs(lam - lam_c)
        out["check_points"] = int(check_points)
    return out
