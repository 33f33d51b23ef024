"""The specialisation time from theory: linearised escape from the plateau plus finite-D
fluctuations (issue #14; docs/theory.md §5, §7, §8).

Coordinates.  x = (M raveled, the upper triangle of Q, a if trained, b if trained) ∈ R^n;
the drift f(x) is the ODE right-hand side of docs/theory.md §5 (``ode.OdeSystem``).

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

Prediction.  X ≈ X_sym + ξ/√D with dξ = J ξ dt + Σ^{1/2} dW, discretised exactly for J
piecewise constant (ξ ← e^{Jh} ξ + N(0, Σh + (JΣ + ΣJᵀ)h²/2)).  The spread along f is
d_f = ‖L_f ξ‖/√D (L_f: m_{:,f} minus its head mean); the linear τ_f is its first crossing
of δ.  The threshold δ = 0.2 is not infinitesimal, so the escape is *continued*: the linear
process is followed to a switch amplitude a_s < δ (default δ/4), and from there the full
nonlinear ODE is integrated from X_sym(t₁) + v(t₁), v = E[ξ | spread = a_s]/√D of the linear
process (no noise after the switch), giving a deterministic map t₁ ↦ τ(t₁) computed at a few t₁
and interpolated.  ``switch_dependence`` is the change of ⟨τ⟩ when a_s is halved.  Measured in
Fig. 6's setting the continuation moves ⟨τ₂⟩ by a few time units only (figures/README.md), so
the linear law is the headline prediction and the continuation a check of its nonlinear part.

Closed forms (one unstable mode, H = 2).  ℓ·ξ(t) is Gaussian with standard deviation g(t),
g² = tr(L_f C₂ L_fᵀ) (C₂ the second moment of ξ), so the linear τ solves g(τ)|Z| = δ√D with
Z ~ N(0, 1): with λ_g = d ln g/dt, ⟨τ⟩ ≈ g⁻¹(δ√D e^{−E ln|Z|}) = ln D/(2λ_g) + const
(E ln|Z| = −(γ_E + ln 2)/2) and Var τ ≈ Var ln|Z|/λ_g² = π²/(8λ_g²), independent of D.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import expm

from .. import __version__
from ..kernels import codegen
from ..model.activations import Activation
from ..expect.drift import QuadratureDrift, SampleDrift
from ..expect.engines import build_engine
from ..expect.montecarlo import head_permutations
from ..model.initial import InitialCondition
from ..model.state import State
from ..model.task import Task
from ..model.validation import as_finite_array, check_int, fail
from .ode import OdeSystem, StepError, StepWatch, build_system, integrate_ode
from ..io.progress import progress_bar
from ..io.results import stamps
from .simulate import ReducedState, psd_factor

E_LOG_ABS_NORMAL = -(np.euler_gamma + np.log(2.0)) / 2   # E ln|Z|, Z ~ N(0, 1)
VAR_LOG_ABS_NORMAL = np.pi ** 2 / 8                      # Var ln|Z|
FD_STEP = 1e-4
NOISE_BATCH = 4096


# ----------------------------------------------------------------------------- coordinates
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
        H, F = self.H, self.F
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


# ----------------------------------------------------------------------------- Jacobian
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


# ----------------------------------------------------------------------------- fluctuations
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
    kern = codegen.sample_kernels(act)
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
    covs = np.array(covs)
    return covs.mean(axis=0), covs.std(axis=0, ddof=1) / np.sqrt(n_batches), np.mean(means, 0)


def initial_covariance(coords: Coordinates, eta: float) -> np.ndarray:
    """Σ₀: covariance of ξ(0) = √D (X(0) − X_sym(0)) for k_h(0) ~ N(0, η²/D I) (exact at all D):
    Var m_{hf} = η², Var Q_{hh} = 2η⁴, Var Q_{hh'} = η⁴, zero covariances; a, b fixed."""
    H = coords.H
    iu = np.triu_indices(H)
    q = np.where(iu[0] == iu[1], 2.0, 1.0) * eta ** 4
    diag = np.concatenate([np.full(coords.n_m, eta ** 2), q,
                           np.zeros(coords.n - coords.n_m - len(q))])
    return np.diag(diag)


# ----------------------------------------------------------------------------- linearisation
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


def symmetric_state(state: State) -> State:
    """The head average of a state (over ``montecarlo.head_permutations``)."""
    perms = head_permutations(state.H)
    M = np.mean([state.M[list(p)] for p in perms], axis=0)
    Q = np.mean([state.Q[np.ix_(list(p), list(p))] for p in perms], axis=0)
    a = np.mean([state.a[list(p)] for p in perms], axis=0)
    b = np.mean([state.b[list(p)] for p in perms], axis=0)
    return State(M, Q, a, b)


def default_engine(n_points: int = 4096, seed: int = 1) -> SampleDrift:
    """Scrambled Sobol points paired with their head permutations: an exactly head-equivariant,
    smooth drift (so X_sym stays symmetric and J has exact block structure)."""
    return build_engine("sobol", samples=n_points, seed=seed, head_symmetric=True)


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
    Jn, Sn, Sse = [], [], []
    for k, i in enumerate(idx):
        Jn.append(jacobian(drift, x[i]))
        S, se, _ = noise_covariance(task, act, coords, traj.state(i), step_rates, noise_samples,
                                    seed=seed + k)
        Sn.append(S)
        Sse.append(se)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    Jn, Sn = np.array(Jn), np.array(Sn)
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
        fail("dt", f"must be {allowed} at this gamma (or use a smaller gamma): the step does not resolve the "
             f"dynamics at t = {times[worst]:.4g}, where the fastest rate of the Jacobian is "
             f"{radius[worst]:.3g} at gamma = {gamma:g} (dt x rate = {rate:.3g} > "
             f"{MAX_STEP_RATE:g})", dt)


def interpolate_nodes(t: np.ndarray, nodes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation in t of matrices given at the nodes."""
    flat = values.reshape(len(nodes), -1)
    out = np.stack([np.interp(t, nodes, flat[:, j]) for j in range(flat.shape[1])], axis=1)
    return out.reshape((len(t),) + values.shape[1:])


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


# ----------------------------------------------------------------------------- sampling
def first_crossing(t: np.ndarray, values: np.ndarray, threshold: float) -> np.ndarray:
    """First t with values > threshold, per row of values (runs × nt), linearly interpolated;
    t[0] if already above at t[0]; inf if never (vectorised ``analysis.crossing_time``)."""
    above = values > threshold
    hit = above.any(axis=1)
    i = np.argmax(above, axis=1)
    out = np.full(values.shape[0], np.inf)
    first = hit & (i == 0)
    out[first] = t[0]
    mid = hit & (i > 0)
    r, k = np.flatnonzero(mid), i[mid]
    x0, x1 = values[r, k - 1], values[r, k]
    out[r] = t[k - 1] + (threshold - x0) / (x1 - x0) * (t[k] - t[k - 1])
    return out


def sample_spreads(lin: Linearisation, xi0: np.ndarray, f: int, rng: np.random.Generator,
                   noise: bool = True) -> np.ndarray:
    """√D × spread along f of the linear process: ‖L_f ξ(t)‖ (runs × nt) from ξ(0) = xi0
    (runs × n); ``noise=False`` drops the SGD noise (the ODE from the same start)."""
    Lf = lin.coords.spread_rows(f)
    roots = np.array([psd_factor(Qk) for Qk in lin.Qstep])
    xi = np.array(xi0, float)
    out = np.empty((xi.shape[0], len(lin.t)))
    out[:, 0] = np.linalg.norm(xi @ Lf.T, axis=1)
    for k in range(len(lin.t) - 1):
        xi = xi @ lin.A[k].T
        if noise:
            xi += rng.standard_normal(xi.shape) @ roots[k].T
        out[:, k + 1] = np.linalg.norm(xi @ Lf.T, axis=1)
    return out


def drawn_xi0(lin: Linearisation, D: int, eta: float, runs: int,
              rng: np.random.Generator) -> np.ndarray:
    """ξ(0) = √D (X(0) − X_sym(0)) with X(0) from the exact law of keys drawn at D."""
    c = lin.coords
    st = ReducedState.drawn(rng, runs, c.H, c.F, D, eta)
    M, Q = st.order_parameters()
    a = np.tile(lin.a0, (runs, 1))
    b = np.tile(lin.b0, (runs, 1))
    return math.sqrt(D) * (c.vector(M, Q, a, b) - lin.x[0])


# ----------------------------------------------------------------------------- continuation
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


# ----------------------------------------------------------------------------- prediction
def tau_summary(taus: np.ndarray) -> dict:
    """Law of τ over samples: mean, std (ddof = 1), standard error of the mean, 10/50/90 %
    quantiles over the ones that crossed, and the fraction that crossed (inf = not by T)."""
    ok = taus[np.isfinite(taus)]
    if ok.size < 2:
        return {"mean": np.inf, "std": np.nan, "mean_se": np.nan, "q10": np.inf,
                "median": np.inf, "q90": np.inf, "fraction": float(ok.size / taus.size)}
    q10, q50, q90 = np.percentile(ok, [10, 50, 90])
    std = float(np.std(ok, ddof=1))
    return {"mean": float(ok.mean()), "std": std, "mean_se": std / math.sqrt(ok.size),
            "q10": float(q10), "median": float(q50), "q90": float(q90),
            "fraction": float(ok.size / taus.size)}


def closed_forms(lin: Linearisation, second_moment: np.ndarray, f: int, D: int,
                 delta: float) -> dict:
    """One-mode closed forms from g(t) = √tr(L_f C₂ L_fᵀ) (module docstring): ⟨τ⟩ solves
    ln g = ln(δ√D) − E ln|Z|; std τ = π/(√8 λ_g(τ)); also λ(τ) of the antisymmetric block with
    its slope 1/(2λ) of ⟨τ⟩ against ln D and std π/(√8 λ)."""
    Lf = lin.coords.spread_rows(f)
    g2 = np.einsum("ij,tjk,ik->t", Lf, second_moment, Lf)
    log_g = 0.5 * np.log(np.maximum(g2, 1e-300))
    rate = np.gradient(log_g, lin.t)
    target = math.log(delta * math.sqrt(D)) - E_LOG_ABS_NORMAL
    tau = first_crossing(lin.t, log_g[None], target)[0]
    if not np.isfinite(tau):
        return {"mean": np.inf, "std": np.nan, "lambda_g": np.nan, "lambda": np.nan,
                "slope": np.nan, "std_lambda": np.nan}
    lam_g = float(np.interp(tau, lin.t, rate))
    lam = float(np.interp(tau, lin.t, lin.lam))
    return {"mean": float(tau), "std": math.sqrt(VAR_LOG_ABS_NORMAL) / lam_g, "lambda_g": lam_g,
            "lambda": lam, "slope": 1.0 / (2 * lam),
            "std_lambda": math.sqrt(VAR_LOG_ABS_NORMAL) / lam}


def predict(lin: Linearisation, system: OdeSystem, D_values: list[int], runs: int = 2000,
            delta: float = 0.2, f: int = 1, eta: float = 1.0, x0: np.ndarray | None = None,
            continuation: bool = False, switch: float | None = None, map_nodes: int = 5,
            map_dt: float = 4.0, seed: int = 0) -> dict:
    """The law of τ_f at each D from ``runs`` samples of the linear process, for keys drawn at D
    (``x0=None``) or from the given overlaps x0 (coordinates; only the SGD noise is random).

    Per D: ``tau`` (the linear prediction: mean, std, mean_se, quantiles, fraction crossed by
    T), ``abs_err`` of its mean (sampler error ⊕ the λ sampling error propagated as
    ⟨τ⟩ δλ/λ ⊕ the nonlinear shift when computed), the closed forms (drawn keys) or the
    noise-free τ (given overlaps).  With ``continuation`` also the nonlinearly continued law
    (``continued``, switch amplitude a_s, default δ/4) and with a_s/2 (``continued_half``)."""
    runs = check_int(runs, "runs", 2)
    delta = float(as_finite_array(delta, "delta"))
    if delta <= 0:
        fail("delta", "specialisation threshold must be > 0", delta)
    if not 0 <= f < lin.coords.F:
        fail("direction", f"must be in 1..F = {lin.coords.F}", f + 1)
    switch = delta / 4 if switch is None else float(switch)
    if not 0 < switch < delta:
        fail("switch", f"must be in (0, delta = {delta:g})", switch)
    Ds = [check_int(D, "D", lin.coords.F + lin.coords.H + 1) for D in D_values]
    rng = np.random.default_rng(seed)
    C0 = initial_covariance(lin.coords, eta) if x0 is None else np.zeros((lin.coords.n,) * 2)
    cov = lin.covariance(C0)
    sampled = []
    for D in Ds:
        xi0 = (drawn_xi0(lin, D, eta, runs, rng) if x0 is None else
               np.tile(math.sqrt(D) * (np.asarray(x0, float) - lin.x[0]), (runs, 1)))
        sampled.append((D, xi0, sample_spreads(lin, xi0, f, rng) / math.sqrt(D)))
    maps = {}
    if continuation:
        mu = (lin.mean(sampled[0][1][0]) if x0 is not None
              else np.zeros((len(lin.t), lin.coords.n)))
        second = cov + np.einsum("ti,tj->tij", mu, mu)
        for key, a_s in (("continued", switch), ("continued_half", switch / 2)):
            maps[key] = build_map(lin, system, sampled, second, f, delta, a_s, map_nodes, map_dt)
    rel_lam = lin.errors.get("sampling_err", 0.0) / abs(lin.errors.get("lambda_mid", np.inf))
    per_D = [prediction_row(lin, D, spreads, xi0, f, delta, maps, cov, x0 is None, rel_lam)
             for D, xi0, spreads in sampled]
    out = {"per_D": per_D, "delta": delta, "direction": f + 1, "runs": runs,
           "T": float(lin.t[-1]), "initial": "drawn at D" if x0 is None else "given",
           "eta": eta, "seed": seed, "lambda_rel_err": rel_lam}
    if continuation:
        out["maps"] = {k: {"t1": m.t1, "tau": m.tau, "switch": m.switch} for k, m in maps.items()}
    return out


def prediction_row(lin: Linearisation, D: int, spreads: np.ndarray, xi0: np.ndarray, f: int,
                   delta: float, maps: dict, cov: np.ndarray, drawn: bool,
                   rel_lam: float) -> dict:
    """One D of :func:`predict`."""
    T = float(lin.t[-1])
    row = {"D": D, "tau": tau_summary(first_crossing(lin.t, spreads, delta))}
    for key, emap in maps.items():
        tau = emap(first_crossing(lin.t, spreads, emap.switch), spreads[:, 0])
        tau[tau > T] = np.inf
        row[key] = tau_summary(tau)
    errs = [row["tau"]["mean_se"], row["tau"]["mean"] * rel_lam]
    if maps:
        row["nonlinear_shift"] = row["continued"]["mean"] - row["tau"]["mean"]
        row["switch_dependence"] = row["continued"]["mean"] - row["continued_half"]["mean"]
        errs.append(row["nonlinear_shift"])
    row["abs_err"] = float(np.sqrt(np.sum(np.square(errs))))
    if drawn:
        row["closed_form"] = closed_forms(lin, cov, f, D, delta)
    else:
        row["noise_free"] = noise_free(lin, maps.get("continued"), xi0[0], f, D, delta)
    return row


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


def noise_free(lin: Linearisation, emap: EscapeMap | None, xi0: np.ndarray, f: int, D: int,
               delta: float) -> dict:
    """τ of the noise-free linear process from the given start (compare with the ODE's own τ
    from the same overlaps), and continued by the map when there is one."""
    Lf = lin.coords.spread_rows(f)
    spread = np.linalg.norm(lin.mean(xi0) @ Lf.T, axis=1)[None] / math.sqrt(D)
    out = {"linear": float(first_crossing(lin.t, spread, delta)[0])}
    if emap is not None:
        t1 = first_crossing(lin.t, spread, emap.switch)
        out["continued"] = float(emap(t1, spread[:, 0])[0])
    return out


# ----------------------------------------------------------------------------- one call
def escape_law(task: Task, act: Activation, H: int, gamma: float, D_values: list[int],
               eta: float = 1.0, initial: State | None = None, T: float = 400.0,
               delta: float = 0.2, direction: int = 2, runs: int = 2000,
               n_points: int = 4096, dt: float = 2.0, every: float = 10.0,
               continuation: bool = False, seed: int = 0, train_a: bool | None = None,
               train_b: bool | None = None, gamma_a: float | None = None,
               gamma_b: float | None = None, progress: bool = True) -> dict:
    """Predicted law of τ_direction (1-based) at each D: keys drawn at D with scale η
    (``initial=None``; X_sym from M = 0, Q = η² I) or the given overlaps ``initial`` (X_sym
    from their head average).  Returns a JSON-ready dict: params, the linearisation summary
    (t, λ(t), X_sym, J/Σ/Φ at the nodes, error estimates) and the prediction per D."""
    H = check_int(H, "H", 1)
    if H < 2:
        fail("H", "escape needs at least 2 heads", H)
    direction = check_int(direction, "direction", 1)
    eta = float(as_finite_array(eta, "eta"))
    if eta <= 0 and initial is None:
        fail("eta", "initialisation scale must be > 0", eta)
    if initial is None:
        start = State(np.zeros((H, task.F)), eta ** 2 * np.eye(H), act.a_default(H, task.L),
                      act.b_default(H, task.L))
    else:
        start = initial
        if start.H != H:
            fail("H", f"must match the initial overlaps' {start.H} heads", H)
    check_inputs(task, H, gamma, D_values, T, dt, delta, direction, runs)
    engine = default_engine(check_int(n_points, "points", 16), seed=1)
    lin = linearise(task, act, start, gamma, T, engine=engine, dt=dt, every=every, seed=seed,
                    check_points=max(16, n_points // 4), train_a=train_a, train_b=train_b,
                    gamma_a=gamma_a, gamma_b=gamma_b, progress=progress)
    system, _ = build_system(task, act, H, engine, gamma, train_a, train_b, gamma_a, gamma_b,
                             False, False)
    x0 = None if initial is None else lin.coords.vector(initial.M, initial.Q, initial.a,
                                                         initial.b)
    pred = predict(lin, system, D_values, runs, delta, direction - 1, eta, x0, continuation,
                   seed=seed)
    nodes = np.searchsorted(lin.t, lin.jac_t - 1e-9)
    summary = {"t": lin.t, "lambda": lin.lam, "x_sym": lin.x, "jacobian_times": lin.jac_t,
               "J_nodes": lin.J[nodes], "Sigma_nodes": lin.Sigma[nodes],
               "Phi_nodes": lin.Phi[nodes], "errors": lin.errors,
               "coordinates": "M raveled, Q upper triangle" +
                              (", a" if lin.coords.train_a else "") +
                              (", b" if lin.coords.train_b else "")}
    params = {**lin.params, "H": H, "D": list(D_values), "eta": eta, "delta": delta,
              "direction": direction, "runs": runs, "n_points": n_points,
              "continuation": continuation,
              "initial": None if initial is None else initial.to_dict()}
    return {**stamps(), "params": params, "linearisation": summary,
            "prediction": pred}


def check_inputs(task: Task, H: int, gamma: float, D_values: list[int], T: float, dt: float,
                 delta: float, direction: int, runs: int) -> None:
    """Validate everything before the (costly) linearisation."""
    g = float(as_finite_array(gamma, "gamma"))
    if g <= 0:
        fail("gamma", "must be > 0", g)
    if not D_values:
        fail("D", "need at least one dimension", D_values)
    for D in D_values:
        check_int(D, "D", task.F + H + 1)
    for name, val in (("T", T), ("dt", dt), ("delta", delta)):
        v = float(as_finite_array(val, name))
        if v <= 0:
            fail(name, "must be > 0", v)
    if not 1 <= direction <= task.F:
        fail("direction", f"must be in 1..F = {task.F}", direction)
    check_int(runs, "runs", 2)
