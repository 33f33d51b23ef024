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

import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, cast

import numpy as np
from scipy import integrate

from ... import __version__
from ...expect.drift import QuadratureDrift, SampleDrift
from ...expect.engines import DriftEngine, build_engine
from ...io.progress import note, progress_bar
from ...model.activations import Activation
from ...model.initial import InitialCondition
from ...model.state import State
from ...model.task import Task
from ...model.validation import as_finite_array, check_number, fail
from ..ode import OdeSystem, build_system, integrate_ode
from .coordinates import Coordinates, coordinates_for, symmetric_state
from .fluctuations import noise_covariance, propagators

FD_STEP = 1e-4
# λ's error at each node, relative to max(|λ|, λ_max/10) (λ_max the largest rate of the
# nodes): 3σ of it is 1 %, so doubling the points moves λ by less than 1 % (issue #43)
LAMBDA_RTOL = 3e-3


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

    def replicates(self, x: np.ndarray) -> np.ndarray:
        """f_r(x) (R, n) of each replicate r of an rqmc engine at its current points (their
        mean is f(x)); each replicate keeps its point set, so f_r is smooth in x."""
        M, Q, a, b = self.system.split(self.flat(x))
        system = self.system
        engine: Any = system.engine            # an rqmc engine (``NodeJacobians.replicated``)
        parts = engine.replicate_estimates(system.task, system.act, M, 0.5 * (Q + Q.T), a, b)
        return np.array([self.coords.vector(*system.split(system.rhs_of(d))) for d in parts])


def jacobian(drift: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
             step: float = FD_STEP) -> np.ndarray:
    """∂f/∂x by central differences with step h = ``step``: (n, n) for f(x) of shape (n,),
    (R, n, n) for a stack of R functions f(x) of shape (R, n)."""
    n = len(x)
    eye = np.eye(n) * step
    columns = [(drift(x + eye[j]) - drift(x - eye[j])) / (2 * step) for j in range(n)]
    return np.stack(columns, axis=-1)


def growth_rate(J: np.ndarray, basis: np.ndarray) -> float:
    """max Re eig(Bᵀ J B): the leading rate of the block on span(B)."""
    return float(np.max(np.linalg.eigvals(basis.T @ J @ basis).real))


def replicate_influence(Jr: np.ndarray, basis: np.ndarray) -> tuple[float, np.ndarray]:
    """λ = growth_rate(J̄) of the mean J̄ of R replicate Jacobians Jr (R, n, n), and the
    jackknife influence of each replicate, δλ_r = (R − 1)(λ − λ₍₋ᵣ₎) (R,), λ₍₋ᵣ₎ the rate of the
    mean without r.

    To first order δλ_r = ∇λ · (J_r − J̄), so the error of λ is √(Σ δλ_r² / (R(R − 1))) and a
    function linear in several λ's (τ through ∫λ dt) propagates replicate by replicate.  The
    leave-one-out form needs no eigenvector derivative, which a degenerate leading eigenvalue
    (the H − 1 copies of identical heads) does not have.

    Examples
    --------
    >>> Jr = np.array([[[0.9]], [[1.1]], [[1.0]], [[1.0]]])
    >>> lam, d = replicate_influence(Jr, np.eye(1))
    >>> round(lam, 12), np.round(d, 12).tolist()
    (1.0, [-0.1, 0.1, 0.0, 0.0])
    """
    R = len(Jr)
    total = Jr.sum(axis=0)
    lam = growth_rate(total / R, basis)
    loo = np.array([growth_rate((total - Jr[r]) / (R - 1), basis) for r in range(R)])
    return lam, (R - 1) * (lam - loo)


def replicate_error(influence: np.ndarray) -> float:
    """√(Σ_r δ_r² / (R(R − 1))): the standard error of a mean-like quantity from its
    replicate influences δ_r (R,) (:func:`replicate_influence`).

    Examples
    --------
    >>> round(replicate_error(np.array([-0.1, 0.1, 0.0, 0.0])), 12)     # √(0.02/12)
    0.040824829046
    """
    R = len(influence)
    return float(np.sqrt(np.sum(np.square(influence)) / (R * (R - 1))))


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

    def lambda_relative_error(self) -> float:
        """λ's error relative to λ at the middle node: the replicates' error there with
        replicated points, else the Sobol check; ⊕ the finite-difference error."""
        err = self.errors
        if "lambda_err" in err:
            sampling = float(err["lambda_err"][len(err["lambda_err"]) // 2])
        else:
            sampling = err.get("sampling_err", 0.0)
        return math.hypot(sampling, err.get("fd_err", 0.0)) / abs(err.get("lambda_mid", np.inf))

    def lambda_tau_error(self, tau: float) -> float:
        """The error of a crossing time τ from the error of the linearisation's rates.

        The leading mode grows like exp ∫₀^τ λ dt, so an error δλ(t) moves τ by
        δτ = −∫₀^τ δλ dt / λ(τ).  With replicated points the integral is taken replicate by
        replicate (δλ_r interpolated between the nodes; the errors of one replicate are
        correlated along t) and the error is √(Σ δτ_r²/(R(R − 1))); otherwise τ δλ/λ at the
        middle node, δλ the Sobol check ⊕ the finite-difference error.  0 for τ = ∞ (not
        crossed), ∞ when λ(τ) ≤ 0."""
        if not np.isfinite(tau):
            return 0.0
        err = self.errors
        if "lambda_influence" not in err:
            return abs(tau) * self.lambda_relative_error()
        lam_tau = float(np.interp(tau, self.t, self.lam))
        if lam_tau <= 0:
            return float("inf")
        influence = np.asarray(err["lambda_influence"], float)          # (nodes, R)
        grid = np.append(self.t[self.t < tau], tau)
        curves = np.stack([np.interp(grid, self.jac_t, influence[:, r])
                           for r in range(influence.shape[1])])
        shifts = integrate.trapezoid(curves, grid, axis=1) / lam_tau
        fd = abs(tau) * err.get("fd_err", 0.0) / abs(err.get("lambda_mid", np.inf))
        return math.hypot(replicate_error(shifts), fd)

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
              engine: DriftEngine | None = None, dt: float = 2.0, every: float = 10.0,
              noise_samples: int = 65536, seed: int = 0, check_points: int | None = 1024,
              train_a: bool | None = None, train_b: bool | None = None,
              gamma_a: float | None = None, gamma_b: float | None = None,
              progress: bool = True, lambda_rtol: float = LAMBDA_RTOL) -> Linearisation:
    """X_sym from the head-symmetric ``start`` (RK4 with step dt, recorded every dt), J and Σ at
    the nodes of :func:`jacobian_nodes`, interpolated linearly in t, the propagators, Φ and λ.

    ``check_points``: repeat J at the node nearest T/2 with that many Sobol points (the engine's
    default has 4096) to estimate the sampling error of λ (None: skip; a fixed Sobol engine).
    With replicated points (``rqmc``) J comes from the replicates instead, and each node's
    points are doubled until λ's error is ≤ ``lambda_rtol`` × max(|λ|, λ_max/10)
    (:class:`NodeJacobians`)."""
    engine = default_engine() if engine is None else engine
    check_number(lambda_rtol, "lambda_rtol", above=0.0)
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
    basis = coords.antisymmetric_basis()
    node_jac = NodeJacobians.start(drift, basis)
    Sn_rows: list[np.ndarray] = []
    Sse: list[np.ndarray] = []
    for k, i in enumerate(idx):
        node_jac.add(x[i])
        S, se, _ = noise_covariance(task, act, coords, traj.state(i), step_rates, noise_samples,
                                    seed=seed + k)
        Sn_rows.append(S)
        Sse.append(se)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    node_jac.refine(x[idx], lambda_rtol, progress)
    Jn, Sn = node_jac.stacked(), np.array(Sn_rows)
    check_step_rate(Jn, t[idx], dt, rates["gamma"])
    J, Sigma = interpolate_nodes(t, t[idx], Jn), interpolate_nodes(t, t[idx], Sn)
    A, Qstep, Phi = propagators(t, J, Sigma)
    lam = np.array([growth_rate(Jk, basis) for Jk in J])
    errors = node_errors(drift, x, idx, Jn, basis, task, act, gamma, check_points, engine)
    errors.update(node_jac.errors())
    errors["sigma_rel_se"] = float(np.max(np.array(Sse)) / max(np.max(np.abs(Sn)), 1e-300))
    params = {"task": task.params(), "activation": act.params(), "start": sym.to_dict(),
              **rates, "T": T, "dt": dt, "jacobian_every": every, "noise_samples": noise_samples,
              "seed": seed, "engine": engine.params(), "fd_step": FD_STEP, "version": __version__}
    return Linearisation(t, x, J, Sigma, A, Qstep, Phi, lam, t[idx], coords, sym.a, sym.b,
                         errors, params)


def frozen_points(engine: object) -> ContextManager:
    """The engine's ``frozen`` block (no growth of its points) or, for fixed engines, none.

    >>> from theory_kit.expect.rqmc import AdaptiveQmcDrift
    >>> eng = AdaptiveQmcDrift()
    >>> with frozen_points(eng):
    ...     eng._frozen
    True
    >>> with frozen_points(object()):
    ...     pass
    """
    frozen = getattr(engine, "frozen", None)
    return frozen() if frozen is not None else nullcontext()


class NodeJacobians:
    """J at the Jacobian nodes; with replicated points (``rqmc``) also each replicate's
    influence on λ (:func:`replicate_influence`), and the nodes refined to a target.

    Replicated: J = mean_r J_r, J_r by central differences of replicate r on one frozen point
    set; λ's error √(Σ δλ_r²/(R(R − 1))).  :meth:`refine` doubles the points (within the
    engine's budget and memory) and recomputes every node whose error exceeds
    ``rtol`` × max(|λ_k|, λ_max/10): near a zero of λ(t) the target is relative to the rates
    that make the escape, not to a vanishing one."""

    def __init__(self, drift: Drift, basis: np.ndarray, replicated: bool) -> None:
        self.drift, self.basis, self.replicated = drift, basis, replicated
        self.J: list[np.ndarray] = []
        self.lam: list[float] = []
        self.influence: list[np.ndarray] = []
        self.points: list[int] = []
        self.rtol = LAMBDA_RTOL
        self.met = True

    @classmethod
    def start(cls, drift: Drift, basis: np.ndarray) -> "NodeJacobians":
        return cls(drift, basis, hasattr(drift.system.engine, "replicate_estimates"))

    def _node(self, x: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        engine = self.drift.system.engine
        if not self.replicated:
            J = jacobian(self.drift, x)
            return J, growth_rate(J, self.basis), np.zeros(0)
        with frozen_points(engine):
            Jr = jacobian(self.drift.replicates, x)
        lam, influence = replicate_influence(Jr, self.basis)
        return Jr.mean(axis=0), lam, influence

    def add(self, x: np.ndarray) -> None:
        J, lam, influence = self._node(x)
        self.J.append(J)
        self.lam.append(lam)
        self.influence.append(influence)
        self.points.append(int(getattr(self.drift.system.engine, "points", 0)))

    def _failing(self) -> np.ndarray:
        lam = np.array(self.lam)
        scale = max(float(np.max(lam)), 0.0) or float(np.max(np.abs(lam)))
        err = np.array([replicate_error(d) for d in self.influence])
        return np.nonzero(err > self.rtol * np.maximum(np.abs(lam), 0.1 * scale))[0]

    def refine(self, xs: np.ndarray, rtol: float, progress: bool) -> None:
        """Double the points and recompute the nodes xs (k, n) off target, until none is."""
        if not self.replicated:
            return
        self.rtol = check_number(rtol, "lambda_rtol", above=0.0)
        system = self.drift.system
        engine: Any = system.engine             # replicated: an rqmc engine
        bad = self._failing()
        while bad.size and engine.grow(system.task, system.H):
            bar = (progress_bar(len(bad), f"escape: lambda at {engine.points} points",
                                unit="node") if progress else None)
            for k in bad:
                self.J[k], self.lam[k], self.influence[k] = self._node(xs[k])
                self.points[k] = int(engine.points)
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.close()
            bad = self._failing()
        self.met = not bad.size
        if not self.met:
            note(f"warning: the escape's growth rate lambda(t) misses its error target "
                 f"({self.rtol:g} relative) at {bad.size} of {len(self.lam)} Jacobian nodes "
                 f"within the engine's {engine.limited_by} ({engine.points} "
                 "points per replicate); its error is carried into tau's abs_err; raise "
                 "--budget (or --max-memory)")

    def stacked(self) -> np.ndarray:
        return np.array(self.J)

    def errors(self) -> dict:
        """λ's error per node, the replicates' influence (nodes, R), the points per node and
        whether every node met ``rtol`` (replicated engines only)."""
        if not self.replicated:
            return {}
        return {"lambda_nodes": np.array(self.lam),
                "lambda_err": np.array([replicate_error(d) for d in self.influence]),
                "lambda_influence": np.array(self.influence), "lambda_points": self.points,
                "lambda_rtol": self.rtol, "lambda_met": self.met}


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
                check_points: int | None, engine: DriftEngine) -> dict:
    """Error estimates of λ at the middle node: finite differences (h against 2h) and, with
    ``check_points``, the Sobol sampling error (|λ_N − λ_{N/4}|-type difference against an
    engine with ``check_points`` points; reported as is, a conservative estimate)."""
    mid = len(idx) // 2
    xm = x[idx[mid]]
    lam = growth_rate(Jn[mid], basis)
    with frozen_points(drift.system.engine):      # h and 2h on one point set
        fd = abs(growth_rate(jacobian(drift, xm, 2 * FD_STEP), basis)
                 - growth_rate(jacobian(drift, xm), basis)) / 3
    out = {"node_t_index": int(idx[mid]), "lambda_mid": lam, "fd_err": fd}
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
