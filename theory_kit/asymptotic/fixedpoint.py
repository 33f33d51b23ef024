"""Fixed points of the order-parameter dynamics, solved for and certified (docs/theory.md §6).

Waiting for the ODE to settle is hopeless near a flat minimum (speeds fall like 1/τ), so
E∞ runs integrate only until the state has left the plateau, then *solve*:

* **Gradient flow** (γ² term dropped, τ = γ t): the fixed points are the stationary points of
  E, and the stable ones its local minima.  E is minimised locally on fixed samples
  (:class:`SampledError`: a smooth deterministic function with its exact gradient, the Bayes
  posterior as control variate so that what is minimised is the excess E − E_Bayes =
  E‖w − p‖²) in the parametrisation K = [M | P] ∈ R^{H×(F+H)}, Q = K Kᵀ (+ a, b when
  trained): L-BFGS, then Newton steps with the Hessian obtained by finite differences of the
  exact gradient.
* **Finite γ**: a root of the full drift (γ² term included) of the ODE's own fixed-sample
  engine, in (M, Q, a, b) coordinates (:func:`solve_drift_root`, MINPACK ``hybr``).
* **Deterministic polish** (gradient flow, per-head activations, discrete priors, any H):
  :class:`PairwiseError` is E with its exact gradient from the pairwise decomposition on the
  Laplace engine (``expect.pairwise``: no samples, ~1e-8 with an error estimate), and
  :func:`polish_gradient_flow` minimises and certifies on it from the sampled solution (or
  from the hand-over when the sampled descent ran off into a sample artefact).

**Certificate** (:class:`Certificate`).  The drift norm at the solution must be below a
stated tolerance, and the linearisation must be stable:

* gradient flow: the smallest eigenvalue of the Hessian of E *on the quotient* by the gauge
  symmetry.  E depends on K only through K Kᵀ, so it is invariant under K → [M | P R],
  R ∈ O(H); at K the orbit's tangent space is spanned by δK = [0 | P A], A antisymmetric,
  and those directions are exact zero modes of the Hessian.  They are projected out (an
  orthonormal basis Z of their orthogonal complement, Hessian Zᵀ ∇²E Z).  Sign flips of
  invariant features and head permutations are discrete and give no zero modes.
* finite γ: in (M, Q) coordinates there is no continuous symmetry left; the eigenvalues of the
  drift's Jacobian J must have negative real parts.  ``min_eigenvalue`` is then
  min −Re λ(J), so that in both cases ``min_eigenvalue > 0`` means stable.

A point with a clearly negative eigenvalue is a saddle: it is never reported as a
minimum.  The solver records it and continues along the unstable direction (gradient flow:
a step along the eigenvector to the lower side and a new minimisation; finite γ: the ODE
integrated from the displaced point, then a new root).  An eigenvalue within the
finite-difference tolerance of 0 is probed along its eigenvector at finite steps: if E rises
on both sides the point is a (degenerate) minimum, otherwise it is escaped like a saddle.

**What the tolerances mean.**  The sampled objective and the fixed-sample drift are
deterministic, so the drift norm can be driven to round-off and is certified against
``drift_tol`` (default 1e-8, absolute: a scaled tolerance let run-offs to ‖x‖ ~ 10⁵ pass).  The *true* fixed point differs from
the sampled one by O(1/√n) in the state; ``drift_stderr`` reports the Monte Carlo standard
error of the gradient at the solution (how far from 0 the population gradient may be), and
:func:`sample_shift` re-solves with an independent sample set to measure the shift of E.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special
from scipy.stats import qmc

from ..model.activations import Activation
from ..kernels.codegen import sample_kernels
from ..expect.error import log_bayes_factor, squared_residual
from ..expect import montecarlo as mc
from ..model.priors import Prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int, fail

POINTS = ("sobol", "mc")
BOUNDARY = "boundary minimum"   # heads switched off at b = −∞ (``boundary``)
STABLE_KINDS = ("minimum", "degenerate minimum", "stable", BOUNDARY)
DRIFT_TOL = 1e-8
FD_STEP = 1e-6          # relative finite-difference step of the Hessian / Jacobian
PROBE_STEPS = (0.3, 0.1, 0.03)   # relative steps along an unstable / flat eigenvector
MAX_STEP_SCALE = 1.0    # cap of the probe / escape step scale (per coordinate)
RUNOFF_FACTOR = 300.0   # a descent whose ‖x‖ grows past this factor has run off (runoff_bound)
RUNOFF = "keys diverge"


# ----------------------------------------------------------------------------- key space
@dataclass
class KeySpace:
    """The solver's coordinates x = (K, a if trained, b of the free heads if trained),
    K = [M | P] ∈ R^{H×(F+H)}, Q = K Kᵀ; untrained a, b stay at ``a0``, ``b0``, and so do the b
    of the heads in ``frozen_b`` (a boundary b_h = +∞ represented at a finite b, module
    ``saturation``).  The fields (task, act, H, a0, b0, train_a, train_b) come first in the
    sampled objective and the deterministic one (:class:`PairwiseError`)."""

    task: Task
    act: Activation
    H: int
    a0: np.ndarray
    b0: np.ndarray
    train_a: bool
    train_b: bool
    frozen_b: tuple[int, ...] = ()

    @property
    def free_b(self) -> np.ndarray:
        """The heads whose b is a coordinate (none when b is not trained)."""
        if not self.train_b:
            return np.zeros(0, int)
        return np.array([h for h in range(self.H) if h not in self.frozen_b], int)

    @property
    def dim(self) -> int:
        return self.H * (self.task.F + self.H) + self.H * int(self.train_a) + len(self.free_b)

    def pack(self, K: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        parts = [np.ravel(K)] + ([a] if self.train_a else []) + [np.asarray(b)[self.free_b]]
        return np.concatenate(parts)

    def scalar_head(self, j: int) -> int:
        """The head of coordinate j among those after the keys (a first, then the free b)."""
        if self.train_a and j < self.H:
            return j
        return int(self.free_b[j - self.H * int(self.train_a)])

    def unpack(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        H, width = self.H, self.task.F + self.H
        return (x[:H * width].reshape(H, width), *self.scalars(x[H * width:]))

    def scalars(self, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) from the coordinates after the keys (``a0``, ``b0`` where not trained)."""
        a = rest[:self.H] if self.train_a else self.a0
        free = self.free_b
        b = np.array(self.b0, float)
        b[free] = rest[len(rest) - len(free):]
        return np.asarray(a, float), b

    def pack_state(self, state: State) -> np.ndarray:
        """A flat vector realising ``state`` (the orthogonal part factorised by eigh)."""
        return self.pack(np.hstack([state.M, state.orthogonal_factor()]), state.a, state.b)

    def state(self, x: np.ndarray) -> State:
        K, a, b = self.unpack(x)
        return State(K[:, :self.task.F], K @ K.T, a, b)

    def quotient(self, x: np.ndarray) -> np.ndarray:
        """Z: orthonormal columns orthogonal to the gauge orbit at x (:func:`gauge_directions`)."""
        return quotient_basis(gauge_directions(self, x), self.dim)



# ----------------------------------------------------------------------------- sampled E
@dataclass
class SampledError(KeySpace):
    """E(K, a, b) on fixed samples (common random numbers) with its exact gradient.

    Keys live in R^{F+H}: K = [M | P], Q = K Kᵀ.  A token's projections on that space are
    G_l ~ N(0, I_{F+H}) plus θ on the first F coordinates of the signal token, so the scores
    S_{hl} = K_h · G_l have exactly the law of docs/theory.md §4.  With g_{hl} = J_{hl}·e and
    ρ_h = ∂w/∂Q_hh·e,

        ∂E/∂K_h = −2 E[Σ_l g_{hl} G_l] − 4 E[ρ_h] K_h,
        ∂E/∂a_h = −2 E[∂w/∂a_h·e],   ∂E/∂b_h = −2 E[Σ_l g_{hl}].

    The flat parameter vector is (K, a if trained, b if trained); untrained a, b stay at
    ``a0``, ``b0``.  Gradient flow on K, τ = γ t, is dK/dτ = −½ ∂E/∂K.  The samples are
    shared by all heads, so the function is exactly symmetric under head permutations, and
    the θ strata make it exactly symmetric under the sign flips of the prior.

    ``points``: ``sobol`` (default; scrambled Sobol points mapped to Gaussians, seeded: the
    minimiser's distance from the population minimiser shrinks much faster than with random
    points — measured for B-softmax, H = 2: excess E 1.9e-6 at 2^15 points against 6.3e-5
    for Monte Carlo) or ``mc`` (independent draws).

    ``control`` (default True): the Bayes posterior p_l = P(ε = l | X) of each sample as a
    control variate.  p is the conditional mean of the one-hot target ẽ, so per sample
    ‖ẽ − w‖² = ‖ẽ − p‖² + ‖w − p‖² + 2 (ẽ − p)·(p − w) with a last term of mean zero; the
    objective is

        E_n = Δ + Σ_i ω_i [(1 − ‖p_i‖²) + ‖w_i − p_i‖²],

    unbiased for E like the plain one (the first part is the tower form of E_Bayes and does
    not depend on the keys), and its gradient is that of the excess Σ ω ‖w − p‖² ≥ 0 alone
    (v = p − w in place of e = ẽ − w above).  The noise the keys could fit is gone: at strong
    signal (F = 4, ν = 10) the plain objective on 2^11 tilted points has minima with E_n below
    E_Bayes at |K| ~ 10³, while the excess cannot go below 0, which B-softmax reaches exactly
    at the atoms on every sample set."""

    n: int = 20_000
    seed: int = 0
    points: str = "sobol"
    tilt: float = 0.0
    control: bool = True
    samples: mc.Samples = field(init=False, repr=False)
    tokens: np.ndarray = field(init=False, repr=False)
    draws: np.ndarray = field(init=False, repr=False)
    draws_flat: np.ndarray = field(init=False, repr=False)
    target: np.ndarray = field(init=False, repr=False)
    floor: float = field(init=False, repr=False)
    evaluations: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        F, H, L = self.task.F, self.H, self.task.L
        if self.points not in POINTS:
            fail("points", f"must be one of {', '.join(POINTS)}", self.points)
        if not (0.0 <= self.tilt < 1.0):
            fail("tilt", "must lie in [0, 1)", self.tilt)
        self.samples = mc.draw_samples(self.task.prior, F + H, L, self.n,
                                       np.random.default_rng(self.seed))
        reps = len(self.samples.weights) // self.n
        if self.points == "sobol":
            u = sobol_normals(self.n, (F + H) * L + L, self.seed)
            g, choice = u[:, :(F + H) * L].reshape(self.n, F + H, L), special.ndtr(u[:, -L:])
        else:
            rng = np.random.default_rng(self.seed + 7_919)
            g, choice = self.samples.g[::reps].copy(), rng.random((self.n, L))
        if self.tilt > 0:
            ratio = self._tilt_tokens(g, choice)
            self.samples.weights[:] *= np.repeat(ratio, reps)
        self.samples.g[:] = np.repeat(g, reps, axis=0)
        self.draws = np.ascontiguousarray(g)      # (n, F + H, L), shared by a draw's θ strata
        self.draws_flat = np.ascontiguousarray(g.transpose(1, 0, 2)).reshape(F + H, -1)
        self.tokens = self.samples.g.copy()
        self.tokens[:, :F, 0] += self.samples.theta
        self.target = np.zeros((len(self.tokens), L))
        self.target[:, 0] = 1.0
        self.floor = self.task.delta
        if self.control:
            self.target = bayes_posterior(self.task.prior, self.tokens[:, :F, :])
            self.floor += float(sample_sum(self.samples.weights,
                                           1.0 - np.sum(self.target ** 2, axis=1)))

    def _tilt_tokens(self, g: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """Importance sampling of the token noise, in place; returns p(g)/q(g) per draw (n,).

        Strong signals make E a rare-event average (a noise token that looks like an atom, a
        signal token that does not), which few points miss — and which the keys can then
        separate.  Each token's noise along U is drawn from the defensive mixture
        q = (1 − α) N(0, I) + α/C Σ_c N(μ_c, I), μ_c = ±θ^(j)/2 over the prior's atoms θ^(j)
        (α = ``tilt``), with the likelihood ratio p/q = 1/[(1 − α) + α/C Σ_c e^{μ_c·g − |μ_c|²/2}]
        in the weights, so the objective stays an unbiased estimate of E."""
        F = self.task.F
        atoms = self.task.prior.atoms()[0] if self.task.prior.is_discrete else \
            np.diag(np.sqrt(self.task.prior.second_moments()))
        mus = 0.5 * np.vstack([atoms, -atoms])                   # (C, F)
        shifted = choice >= 1.0 - self.tilt                      # (n, L)
        comp = np.minimum(((choice - (1.0 - self.tilt)) / self.tilt * len(mus)).astype(int),
                          len(mus) - 1)
        g[:, :F, :] += np.where(shifted[:, None, :], mus[np.clip(comp, 0, None)].transpose(0, 2, 1), 0.0)
        proj = np.einsum("cf,nfl->ncl", mus, g[:, :F, :]) - 0.5 * np.sum(mus ** 2, 1)[None, :, None]
        mix = (1.0 - self.tilt) + self.tilt * np.mean(np.exp(proj), axis=1)   # (n, L)
        return np.prod(1.0 / mix, axis=1)

    @classmethod
    def for_activation(cls, task: Task, act: Activation, H: int, n: int = 20_000,
                       seed: int = 0, train_a: bool | None = None,
                       train_b: bool | None = None, points: str = "sobol",
                       tilt: float = 0.0, control: bool = True) -> "SampledError":
        """The objective with the activation's default a, b and training flags."""
        return cls(task, act, H, act.a_default(H, task.L), act.b_default(H, task.L),
                   act.train_a if train_a is None else train_a,
                   act.train_b if train_b is None else train_b, n=n, seed=seed, points=points,
                   tilt=tilt, control=control)

    def _per_sample(self, x: np.ndarray) -> tuple:
        """(K, w (n, L), e (n, L), Jv (n, H, L), Av, Bv, Qv (n, H)) at x, v = e = target − w
        (target: the posterior p with ``control``, else the one-hot ẽ): the generated kernels
        of ``codegen.sample_kernels`` (numba, or NumPy without it)."""
        K, a, b = self.unpack(x)
        S = self.scores(K)
        kern = sample_kernels(self.act)
        W, D, D2, w = kern.weights(S, b, np.sum(K * K, axis=1), a)
        e = self.target - w
        return (K, w, e) + tuple(kern.vjp(W, D, D2, a, e))

    def _per_sample_value(self, w: np.ndarray, e: np.ndarray) -> np.ndarray:
        """The per-sample summand of E_n without Δ, shape (n,)."""
        if self.control:
            return 1.0 - np.sum(self.target ** 2, axis=1) + np.sum(e ** 2, axis=1)
        return squared_residual(w)

    @property
    def reps(self) -> int:
        """θ strata per noise draw (rows of one draw are consecutive)."""
        return len(self.samples.weights) // self.n

    def scores(self, K: np.ndarray) -> np.ndarray:
        """S_{hl} = K_h · G_l of every row, shape (n·reps, H, L).

        The noise G is shared by the θ strata of a draw and θ enters only the first F
        coordinates of token 0, so S = K G per draw (repeated over the strata) plus
        K[:, :F] θ on token 0: reps times fewer products than K times every row's tokens."""
        S = np.repeat(np.matmul(K, self.draws), self.reps, axis=0)
        S[:, :, 0] += np.einsum("nf,hf->nh", self.samples.theta, K[:, :self.task.F])
        return S

    def token_contraction(self, A: np.ndarray) -> np.ndarray:
        """Σ_rows Σ_l A_{hl} (G_l + θ δ_{l0})_k, shape (H, F + H), for A of shape (n·reps, H, L).

        Factored like :meth:`scores`: the strata of a draw are summed first (they share G),
        the θ part is a sum over rows of token 0 alone.  NumPy loops (``einsum`` without
        ``optimize``), not BLAS, so that the rounding does not depend on the thread count
        (see :func:`sample_sum`); the contracted axes are made contiguous first (≈ 4x faster
        than einsum on the strided (n, ·, L) layout, measured at H = 8, F = 4)."""
        n, H, L = self.n, A.shape[1], A.shape[2]
        per_draw = A.reshape(n, self.reps, H, L).sum(axis=1)
        left = np.ascontiguousarray(per_draw.transpose(1, 0, 2)).reshape(H, n * L)
        out = np.einsum("hm,km->hk", left, self.draws_flat)
        out[:, :self.task.F] += np.einsum("nh,nf->hf", A[:, :, 0], self.samples.theta)
        return out

    def hessian(self, x: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, float]:
        """(Zᵀ ∇²E Z by :func:`fd_hessian` of the exact gradient, 0): the eigenvalue tolerance
        of the sampled objective is :func:`_eig_tol` alone."""
        return fd_hessian(lambda y: self.value_and_grad(y)[1], x, Z), 0.0

    def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """(E, ∂E/∂x) on the fixed samples."""
        self.evaluations += 1
        K, w, e, Jv, Av, Bv, Qv = self._per_sample(x)
        wts = self.samples.weights
        value = self.floor + float(sample_sum(wts, np.sum(e ** 2, axis=1)))
        dK = (-2.0 * self.token_contraction(Jv * wts[:, None, None])
              - 4.0 * sample_sum(wts, Qv)[:, None] * K)
        return value, self.pack(dK, -2.0 * sample_sum(wts, Av), -2.0 * sample_sum(wts, Bv))

    def draw_values(self, x: np.ndarray) -> np.ndarray:
        """The summand of E_n − Δ per noise draw (θ strata of a draw summed), scaled so that
        their mean is E_n − Δ; shape (n,).  Weights only (no VJP): the cheap path for
        standard errors and paired comparisons of two points on one sample set."""
        K, a, b = self.unpack(x)
        w = sample_kernels(self.act).weights(self.scores(K), b, np.sum(K * K, axis=1), a)[3]
        groups = np.zeros(self.samples.n_groups)
        np.add.at(groups, self.samples.group,
                  self.samples.weights * self._per_sample_value(w, self.target - w))
        return groups * self.samples.n_groups

    def value_stderr(self, x: np.ndarray) -> float:
        """Standard error of E at x as if the n noise draws were independent (θ strata of one
        draw summed first; for Sobol points an upper bound of the typical error)."""
        groups = self.draw_values(x)
        return float(np.std(groups, ddof=1) / np.sqrt(len(groups)))

    def grad_stderr(self, x: np.ndarray) -> float:
        """Standard error of ‖∂E/∂x‖ at x as if the n points were independent:
        √(Σ_i Var_i / n) over the noise draws (θ strata of one draw summed first) — the scale of
        the population gradient where the sampled one vanishes (for Sobol points an upper
        bound of the typical size)."""
        K, w, e, Jv, Av, Bv, Qv = self._per_sample(x)
        per = np.concatenate([
            (-2.0 * np.einsum("nhl,nkl->nhk", Jv, self.tokens)
             - 4.0 * Qv[:, :, None] * K[None]).reshape(len(e), -1),
            *([-2.0 * Av] if self.train_a else []),
            -2.0 * Bv[:, self.free_b]], axis=1)
        wts = self.samples.weights
        groups = np.zeros((self.samples.n_groups, per.shape[1]))
        np.add.at(groups, self.samples.group, wts[:, None] * per)
        groups *= self.samples.n_groups
        return float(np.sqrt(np.sum(groups.var(axis=0, ddof=1)) / len(groups)))


# ----------------------------------------------------------------------------- deterministic E
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
    may need Newton to continue (:func:`_at_finer_levels`), and the key cap."""

    level: float | None = None
    descent_level: float | None = None
    evaluations: int = field(default=0, init=False)

    @contextlib.contextmanager
    def at_level(self, level: float):
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
    (``expect.pairwise``).  Same coordinates as :class:`SampledError`, no samples: there is
    nothing for the keys to fit, so a descent on it cannot run off into a sample artefact.

    ``value_and_grad`` works at one fixed resolution ``level`` (a smooth function, for L-BFGS
    and finite differences); :meth:`evaluate` adds the error estimates (``Fields.value_err``,
    ``grad_err``).  ``hessian`` differentiates the gradient per coordinate and recomputes only
    the sub-models that contain that coordinate's head (H − 1 pairs and one single of the
    H(H−1)/2 + H), bit for bit the same columns as differencing the whole gradient."""

    engine: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from ..expect import pairwise     # imports the Laplace engine (numba)
        self.engine = pairwise.PairwiseLaplace(self.task, self.act, self.H)
        if self.level is None:
            self.level = pairwise.DEFAULT_LEVEL
        if self.descent_level is None:
            self.descent_level = pairwise.DESCENT_LEVEL

    def finer_levels(self) -> list[float]:
        from ..expect.pairwise import LEVELS
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
        K, a, b = self.unpack(x)
        cap = KeyCap(K)
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


def bayes_posterior(prior: Prior, proj: np.ndarray) -> np.ndarray:
    """P(ε = l | X) ∝ g(p_l) from the projections p = Uᵀx, shape (n, F, L) → (n, L)
    (``error.log_bayes_factor``, normalised over the tokens)."""
    logg = log_bayes_factor(prior, proj)
    return np.exp(logg - special.logsumexp(logg, axis=-1, keepdims=True))


def sample_sum(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ_n weights_n values_n over the leading (sample) axis, shape values.shape[1:].

    By NumPy's own loops (``einsum`` without ``optimize``), never BLAS: OpenBLAS splits long
    dot products (``weights @ values`` with 1-D values) among its threads, so the rounding
    depended on the thread count — and Dask's workers run with OPENBLAS_NUM_THREADS=1, which
    made E∞ through a LocalCluster differ from local processes at ~1e-8 after the solver
    amplified the last-bit difference.  The same holds for the gradient's contraction above."""
    return np.einsum("n,n...->...", weights, values)


def sobol_normals(n: int, dim: int, seed: int) -> np.ndarray:
    """n scrambled Sobol points in [0,1)^dim mapped to N(0, 1) coordinates, shape (n, dim)."""
    sampler = qmc.Sobol(d=dim, scramble=True, seed=seed)
    with warnings.catch_warnings():  # n not a power of 2 only loses the balance property
        warnings.simplefilter("ignore")
        u = sampler.random(n)
    return special.ndtri(np.clip(u, 1e-300, 1 - 1e-16))


# ----------------------------------------------------------------------------- the quotient
def gauge_directions(obj: SampledError, x: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning the tangent space of the orbit {[M | P R] : R ∈ O(H)} at x.

    The generators are δK = [0 | P A_ij] with A_ij = e_i e_jᵀ − e_j e_iᵀ (i < j); rank-deficient
    P gives fewer independent directions, kept by an SVD with a relative cut 1e-9.  Shape
    (n_gauge, dim)."""
    K, _, _ = obj.unpack(x)
    F, H = obj.task.F, obj.H
    P = K[:, F:]
    gens = []
    for i in range(H):
        for j in range(i + 1, H):
            A = np.zeros((H, H))
            A[i, j], A[j, i] = 1.0, -1.0
            dK = np.zeros_like(K)
            dK[:, F:] = P @ A
            gens.append(np.concatenate([dK.ravel(), np.zeros(obj.dim - K.size)]))
    if not gens:
        return np.zeros((0, obj.dim))
    u, s, vt = np.linalg.svd(np.array(gens), full_matrices=False)
    keep = s > 1e-9 * max(1.0, float(np.abs(P).max()))
    return vt[keep]


def quotient_basis(gauge: np.ndarray, dim: int) -> np.ndarray:
    """Orthonormal columns Z (dim, dim − n_gauge) orthogonal to the gauge rows."""
    if len(gauge) == 0:
        return np.eye(dim)
    q, _ = np.linalg.qr(np.hstack([gauge.T, np.eye(dim)]))
    return q[:, len(gauge):dim]


def fd_hessian(grad, x: np.ndarray, Z: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """Zᵀ ∇²E Z by central differences of the exact gradient along the columns of Z,
    symmetrised; shape (k, k), k = Z.shape[1].  Step h = step·max(1, |x|)."""
    Hq = fd_columns(grad, x, Z, step)
    return 0.5 * (Hq + Hq.T)


def fd_columns(grad, x: np.ndarray, Z: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """:func:`fd_hessian` before it is symmetrised (its asymmetry measures the differences'
    truncation and rounding)."""
    h = step * max(1.0, float(np.linalg.norm(x)))
    cols = [Z.T @ (grad(x + h * z) - grad(x - h * z)) / (2 * h) for z in Z.T]
    return np.array(cols).T


# ----------------------------------------------------------------------------- certificate
@dataclass(frozen=True)
class Certificate:
    """Why a solution is (or is not) a stable fixed point.

    ``drift_norm``: ‖dx/dτ‖ = ½‖∂E/∂x‖ (gradient flow, sampled objective) or ‖dy/dt‖ (finite
    γ, fixed-sample drift); ``drift_tol`` its threshold.  ``min_eigenvalue``: smallest
    eigenvalue of the quotient Hessian of E (gradient flow) or min −Re λ(J) (finite γ);
    ``eig_tol``: the finite-difference resolution below which |λ| counts as zero.
    ``kind``: "minimum", "degenerate minimum" (a zero eigenvalue, E rising on both sides of
    its eigenvector), "stable" (finite γ: every Re λ(J) < 0), "saddle", "not converged" or
    "objective unreliable" (:func:`check_objective`).  ``zero_modes``: gauge directions projected
    out.  ``drift_stderr``: Monte Carlo standard error of the drift at the solution (the
    scale of the population drift there; not part of the test)."""

    drift_norm: float
    drift_tol: float
    min_eigenvalue: float
    eig_tol: float
    kind: str
    zero_modes: int
    drift_stderr: float = float("nan")

    @property
    def certified(self) -> bool:
        return self.drift_norm <= self.drift_tol and self.kind in STABLE_KINDS

    def to_dict(self) -> dict:
        return {"certified": self.certified, "drift_norm": self.drift_norm,
                "drift_tol": self.drift_tol, "min_eigenvalue": self.min_eigenvalue,
                "eig_tol": self.eig_tol, "kind": self.kind, "zero_modes": self.zero_modes,
                "drift_stderr": self.drift_stderr}

    @classmethod
    def from_dict(cls, d: dict) -> "Certificate":
        return cls(d["drift_norm"], d["drift_tol"], d["min_eigenvalue"], d["eig_tol"],
                   d["kind"], d["zero_modes"], d.get("drift_stderr", float("nan")))


@dataclass(frozen=True)
class FixedPoint:
    """A solved fixed point: the state, its certificate, the saddles passed on the way."""

    state: State
    certificate: Certificate
    solver: str
    sampled_error: float
    saddles: list[dict]
    evaluations: int
    seconds: float
    runoff: dict | None = None      # RunoffCheck.to_dict() of a run-off (einf.solve_checked)
    error_abs_err: float | None = None   # abs_err of sampled_error when it is deterministic
    presolve: dict | None = None    # the sampled solve a deterministic polish started from
    boundary: dict | None = None    # pruning, reduced model, revival slopes (boundary minimum)

    def to_dict(self) -> dict:
        """The fixed point as JSON.  The wall-clock ``seconds`` sit apart in ``timing``: they are
        provenance, not data (everything outside ``timing`` is the same bit for bit on every
        backend and machine)."""
        return {"state": self.state.to_dict(), "certificate": self.certificate.to_dict(),
                "solver": self.solver, "sampled_error": self.sampled_error,
                "saddles": self.saddles, "evaluations": self.evaluations,
                "runoff": self.runoff, "error_abs_err": self.error_abs_err,
                "presolve": self.presolve, "boundary": self.boundary,
                "timing": {"seconds": self.seconds}}

    @classmethod
    def from_dict(cls, d: dict) -> "FixedPoint":
        seconds = d["timing"]["seconds"] if "timing" in d else d["seconds"]   # older files
        return cls(State(**d["state"]), Certificate.from_dict(d["certificate"]), d["solver"],
                   d["sampled_error"], d["saddles"], d["evaluations"], seconds, d.get("runoff"),
                   d.get("error_abs_err"), d.get("presolve"), d.get("boundary"))


def _eig_tol(eigs: np.ndarray) -> float:
    """|λ| below this is zero at the resolution of the finite-difference Hessian."""
    return max(1e-7, 1e-6 * float(np.max(np.abs(eigs))) if len(eigs) else 1e-7)


def _drift_tol(x: np.ndarray, tol: float) -> float:
    """The drift threshold at x: ``tol`` itself, absolute.  It used to be tol·max(1, ‖x‖),
    which at the run-offs of softmax (F = 4, ν = 10, ‖x‖ ~ 10⁵) accepted a drift of 10⁻³ and
    let finite-step probes certify 'degenerate minima' there (E by fresh Monte Carlo 5–8e-4
    above bounded points).  The solved functions are deterministic, so ‖∇E‖ reaches
    round-off at a true minimum whatever its scale (measured: ≤ 2e-9 at every certified Fig. 4
    point, ‖x‖ up to 18)."""
    del x
    return tol


# ----------------------------------------------------------------------------- gradient flow
def max_key_norm(obj: KeySpace, x: np.ndarray) -> float:
    """The largest key norm max_h |k_h| of x."""
    return float(np.max(np.linalg.norm(obj.unpack(x)[0], axis=1)))


def _minimise(obj: KeySpace, x0: np.ndarray, maxiter: int,
              bound: float = np.inf, gtol: float = 1e-12, key_bound: float = np.inf
              ) -> tuple[np.ndarray, bool]:
    """L-BFGS from x0: (the last iterate, whether it was stopped for ‖x‖ > ``bound`` or a key
    norm > ``key_bound``); ``gtol``: L-BFGS-B's bound on the largest gradient entry."""
    last = [x0]
    outside = lambda y: bool(np.linalg.norm(y) > bound or (
        np.isfinite(key_bound) and max_key_norm(obj, y) > key_bound))

    def watch(xk: np.ndarray) -> None:
        last[0] = xk.copy()
        if outside(xk):
            raise StopIteration

    res = optimize.minimize(obj.value_and_grad, x0, jac=True, method="L-BFGS-B",
                            callback=watch, options={"maxiter": maxiter, "gtol": gtol,
                                                     "ftol": 1e-15, "maxcor": 30})
    x = res.x if res.x is not None else last[0]
    return x, outside(x)


def runoff_bound(x: np.ndarray) -> float:
    """‖x‖ beyond which a descent from x counts as running off: ``RUNOFF_FACTOR``·max(1, ‖x‖).

    At strong signal the sampled E can fall along directions where the keys grow without
    end (a sample set the keys separate, or hard attention fitting rare events): measured at
    F = 4, ν = 10, the hand-overs had ‖x‖ ≈ 2–4.5 and the run-offs ‖x‖ = 180–6·10⁵, while the
    B-softmax minimum at the atoms has ‖x‖ = 17.9 (H = 8).  There the drift tolerance, relative
    to ‖x‖, means nothing any more and every Hessian is wasted (≈ 250 CPU s for one H = 8
    softmax run that ended at ‖x‖ ≈ 6·10⁵ "saddles").  A factor 30 was too tight: softmax
    at F = 4, ν = 10, H = 4 descends past ‖x‖ ≈ 110 (from 3.5) with E still falling, so
    only the far run-offs (‖x‖ ≳ 10³) are cut."""
    return RUNOFF_FACTOR * max(1.0, float(np.linalg.norm(x)))


NEWTON_STEPS = 30      # trust-region steps of :func:`_newton` (one gradient each)
NEWTON_ROUNDS = 3      # new Hessians after a Newton stage that moved x (:func:`_descend`)
RECLASSIFY_MOVE = 1e-4  # ... by more than this × max(1, ‖x‖) (100 finite-difference steps)
ROUNDING = 1e-13       # relative size of E's rounding: a smaller predicted fall is not testable


def _trust_step(eigs: np.ndarray, vecs: np.ndarray, gq: np.ndarray, radius: float
                ) -> np.ndarray:
    """argmin of the model gᵀp + ½ pᵀ Hq p over ‖p‖ ≤ radius, Hq = vecs diag(eigs) vecsᵀ
    positive definite: p(μ) = −(Hq + μ I)⁻¹ g with μ = 0 (the Newton step) when it fits, else
    the μ > 0 with ‖p(μ)‖ = radius (Levenberg–Marquardt; ‖p(μ)‖ falls monotonically in μ)."""
    c = vecs.T @ gq
    size = lambda mu: float(np.sqrt(np.sum((c / (eigs + mu)) ** 2)))
    mu = 0.0
    if size(0.0) > radius:
        hi = max(float(np.linalg.norm(c)) / radius, 1e-300)   # size(hi) ≤ radius
        # at a radius near rounding (hi ≫ every eigenvalue) size(hi) = ‖c‖/hi = radius can
        # round to just above radius: no bracket, and p(hi) is the step of that radius
        if size(hi) < radius:
            mu = optimize.brentq(lambda m: size(m) - radius, 0.0, hi, xtol=1e-14 * hi,
                                 rtol=1e-12)
        else:
            mu = hi
    return -vecs @ (c / (eigs + mu))


def _bfgs_update(eigs: np.ndarray, vecs: np.ndarray, s: np.ndarray, y: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The model Hessian B = vecs diag(eigs) vecsᵀ after the BFGS update with the step s and
    the change of gradient y, B ← B − B s sᵀ B / sᵀBs + y yᵀ / yᵀs (positive definite stays
    so), as (eigenvalues, eigenvectors); unchanged where yᵀs ≤ 0 or the step is at the
    rounding of the gradient (y below 1e-12 of |s| |B|)."""
    B = vecs @ (eigs[:, None] * vecs.T)
    Bs = B @ s
    ys, sBs = float(y @ s), float(s @ Bs)
    if ys <= 1e-12 * float(np.linalg.norm(y) * np.linalg.norm(s)) or sBs <= 0 or \
            np.linalg.norm(y) <= 1e-12 * np.linalg.norm(s) * float(np.max(np.abs(eigs))):
        return eigs, vecs
    B = B - np.outer(Bs, Bs) / sBs + np.outer(y, y) / ys
    return np.linalg.eigh(0.5 * (B + B.T))


def _newton(obj: KeySpace, x: np.ndarray, Z: np.ndarray, Hq: np.ndarray,
            tol: float, steps: int = NEWTON_STEPS) -> tuple[np.ndarray, bool]:
    """Trust-region Newton steps on the quotient from the Hessian Hq (positive definite at a
    minimum) until ‖∇E‖ ≤ tol: (last point, whether every step was the full Newton step of
    the model, x ← x − Z B⁻¹ Zᵀ∇E, i.e. the quadratic model held).  The model Hessian B starts
    at Hq and is BFGS-updated with every trial step's change of gradient
    (:func:`_bfgs_update`, no extra evaluations): along a curved valley the chord Hessian's
    flat direction no longer points along the floor.

    Step p = Z :func:`_trust_step` (radius Δ; the first Δ is twice the Newton step's length,
    so that the first step is the chord-Newton step of the old loop).  Taken when E falls by
    at least 1/10 of the model's prediction −(gᵀp + ½pᵀB p) — or, where that
    prediction is below E's rounding (``ROUNDING``·max(1, |E|)), when ‖∇E‖ falls; Δ is doubled
    after a good step that reached the boundary, quartered after a rejected one.  Why: in a
    flat valley (smallest eigenvalue ~1e-6 at softmax F = 4, ν = 10, H = 8) the full step
    along the flat direction leaves the region where the quadratic model holds and the plain
    chord-Newton step raised ‖∇E‖ and stopped (seed 1, ½‖∇E‖ = 3.7e-5); E itself, not ‖∇E‖,
    is the merit function that a shorter step along the model's descent direction lowers."""
    eigs, vecs = np.linalg.eigh(0.5 * (Hq + Hq.T))
    e, g = obj.value_and_grad(x)
    radius, exact = None, True
    for _ in range(steps):
        if np.linalg.norm(g) <= _drift_tol(x, tol):
            break
        gq = Z.T @ g
        if radius is None:      # the first step is the Newton step
            radius = 2.0 * float(np.linalg.norm((vecs.T @ gq) / eigs))
        pq = _trust_step(eigs, vecs, gq, radius)
        interior = float(np.linalg.norm(pq)) < 0.99 * radius    # μ = 0: the Newton step
        predicted = -(gq @ pq + 0.5 * pq @ (vecs @ (eigs * (vecs.T @ pq))))
        e_trial, g_trial = obj.value_and_grad(x + Z @ pq)
        eigs, vecs = _bfgs_update(eigs, vecs, pq, Z.T @ (g_trial - g))
        if predicted > ROUNDING * max(1.0, abs(e)):
            good = e - e_trial >= 0.1 * predicted
        else:
            good = np.linalg.norm(g_trial) < np.linalg.norm(g)
        if not good:
            exact, radius = False, 0.25 * float(np.linalg.norm(pq))
            continue
        exact = exact and interior
        if not interior and e - e_trial >= 0.75 * predicted:
            radius *= 2.0
        x, e, g = x + Z @ pq, e_trial, g_trial
    return x, exact


def step_scale(x: np.ndarray) -> float:
    """Scale of the probe and escape steps: the rms coordinate max(1, |x|)/√dim, capped at
    ``MAX_STEP_SCALE``.  Uncapped, a point that has run off to large keys (|K| ~ 10³ at F = 4,
    ν = 10, where the sampled E is a rare-event average) took escape steps of hundreds, far
    beyond the region where the quadratic model of the saddle means anything."""
    return min(max(1.0, float(np.linalg.norm(x))) / np.sqrt(len(x)), MAX_STEP_SCALE)


def _probe(obj: SampledError, x: np.ndarray, v: np.ndarray) -> bool:
    """Whether E rises on both sides of x along v at every probe step."""
    e0 = obj.value_and_grad(x)[0]
    scale = step_scale(x)
    for h in PROBE_STEPS:
        for sign in (1.0, -1.0):
            y = x + sign * h * scale * v
            if obj.value_and_grad(y)[0] < e0 - 1e-14 * max(1.0, abs(e0)):
                return False
    return True


@dataclass(frozen=True)
class _Local:
    """The quotient Hessian at one point and what it says."""

    kind: str
    eigs: np.ndarray
    vecs: np.ndarray      # eigenvectors in x coordinates, columns
    Z: np.ndarray
    Hq: np.ndarray
    zero_modes: int
    eig_tol: float


def _newton_ready(local: _Local) -> bool:
    """Whether trust-region Newton (:func:`_newton`) can run on ``local``'s Hessian: positive
    definite (a minimum, or a degenerate one whose smallest eigenvalue is still > 0)."""
    return bool(np.linalg.eigvalsh(0.5 * (local.Hq + local.Hq.T))[0] > 0)


def _classify(obj: KeySpace, x: np.ndarray) -> _Local:
    """Quotient Hessian at x (gauge removed) and the kind of stationary point it indicates."""
    Z = obj.quotient(x)
    Hq, fd_err = obj.hessian(x, Z)
    eigs, vecs = np.linalg.eigh(Hq)
    etol = max(_eig_tol(eigs), fd_err)
    kind = "minimum"
    if eigs[0] < -etol:
        kind = "saddle"
    elif eigs[0] <= etol:
        kind = "degenerate minimum" if _probe(obj, x, Z @ vecs[:, 0]) else "saddle"
    return _Local(kind, eigs, Z @ vecs, Z, Hq, obj.dim - Z.shape[1], etol)


def _certificate(obj: SampledError, x: np.ndarray, local: _Local, tol: float) -> Certificate:
    g = obj.value_and_grad(x)[1]
    return Certificate(0.5 * float(np.linalg.norm(g)), 0.5 * _drift_tol(x, tol),
                       float(local.eigs[0]), local.eig_tol, local.kind, local.zero_modes,
                       0.5 * obj.grad_stderr(x))


def solve_gradient_flow(obj: SampledError, state: State, tol: float = DRIFT_TOL,
                        max_escapes: int = 4, maxiter: int = 3000,
                        coarse: SampledError | None = None,
                        key_bound: float = np.inf) -> FixedPoint:
    """A certified local minimum of the sampled E reached from ``state``.

    Loop: L-BFGS from x; quotient Hessian Hq = Zᵀ∇²E Z (:func:`fd_hessian`, gauge removed by
    :func:`gauge_directions`); if its smallest eigenvalue λ < −eig_tol the point is a saddle:
    recorded, and x moves to the lower side along the eigenvector (:func:`escape`), up to
    ``max_escapes`` times; if |λ| ≤ eig_tol, E is probed along it (rises on both sides:
    degenerate minimum; else escaped as a saddle); at a minimum, chord-Newton steps on the
    quotient until ‖∇E‖ ≤ tol (absolute).  The certificate says what the last point is.

    ``coarse`` (optional): an objective on fewer points (a subset of ``obj``'s, e.g. the first
    n/4 Sobol points of the same seed) on which the same loop runs first
    (:func:`_presolve`): the long descent from the hand-over and the saddles met on the way
    cost a fraction of an evaluation of ``obj`` there, and ``obj``'s loop starts near its
    minimum.  The certificate is always ``obj``'s.

    ``key_bound``: a descent whose largest key norm passes it is stopped there like a run-off
    (kind ``RUNOFF``, never certified; for a caller that has no use for such a point)."""
    start, evals0 = time.perf_counter(), obj.evaluations
    x = obj.pack_state(state)
    bound = runoff_bound(x)
    saddles: list[dict] = []
    if coarse is not None:
        x, saddles = _presolve(obj, coarse, x, max_escapes, maxiter, bound, key_bound)
    x, local, fine_saddles = _descend(obj, x, tol, max_escapes, maxiter, bound, gtol=1e-12,
                                      key_bound=key_bound)
    cert = _certificate(obj, x, local, tol) if local is not None else _runoff_certificate(
        obj, x, tol)
    evals = obj.evaluations - evals0
    solver = "L-BFGS + Newton on K = [M | P] (quotient Hessian)"
    if coarse is not None:
        solver += f"; descent first on {coarse.n} of the {obj.n} points"
    if local is None and max_key_norm(obj, x) > key_bound:
        solver += f"; stopped where a key norm passed {key_bound:.3g}"
    return FixedPoint(obj.state(x), cert, solver, float(obj.value_and_grad(x)[0]),
                      saddles + fine_saddles, evals, time.perf_counter() - start)


GRADIENT_UNRESOLVED = "gradient unresolved"
# L-BFGS of the polish stops at this largest gradient entry and Newton on the quotient (with
# the Hessian the certificate needs anyway) takes over: each gradient costs ~10 CPU s at H = 8
# (F = 4, ν = 10, |k| ≈ 4), and L-BFGS to 1e-12 spends most of its iterations on the last
# digits that two Newton steps give.
POLISH_GTOL = 1e-6


def _descend(obj, x: np.ndarray, tol: float, max_escapes: int, maxiter: int,
             bound: float, gtol: float = POLISH_GTOL, key_bound: float = np.inf
             ) -> tuple[np.ndarray, "_Local | None", list[dict]]:
    """L-BFGS (to ``gtol``), quotient Hessian, saddles escaped up to ``max_escapes`` times,
    trust-region Newton at a minimum or a degenerate one with λ_min > 0 (:func:`_newton`):
    (last point, its classification or None after a run-off, the saddles passed).  The
    sampled solve and the polish share it.

    The classification must be that of the point returned: when Newton moved x by more than
    ``RECLASSIFY_MOVE``·max(1, ‖x‖) or its quadratic model failed (a damped or rejected
    step), the Hessian is computed again there (up to ``NEWTON_ROUNDS`` times, each followed by
    Newton with the new Hessian; after the last, the point is classified as it is) — a flat
    valley's curvature can change sign along the way, and a saddle is never certified."""
    saddles: list[dict] = []
    local, attempt, rounds = None, 0, 0
    beyond = getattr(obj, "beyond_cap", lambda y: False)     # the deterministic E's KEY_CAP
    while True:
        x, ran_off = _minimise(obj, x, maxiter, bound, gtol, key_bound)
        if ran_off or beyond(x):
            return x, None, saddles
        local = _classify(obj, x)
        if local.kind != "saddle":
            # a degenerate minimum whose smallest eigenvalue is positive (inside its
            # tolerance) still has a positive definite Hq, which trust-region Newton needs:
            # L-BFGS alone ended such a point at ½‖∇E‖ = 7.7e-7 (softmax-1, F = 4, ν = 10,
            # 4 heads, λ_min = 3.3e-5 against a tolerance 3.7e-5)
            if _newton_ready(local):
                y, exact = _newton(obj, x, local.Z, local.Hq, tol)
                moved = np.linalg.norm(y - x) > RECLASSIFY_MOVE * max(1.0, np.linalg.norm(x))
                x = y
                if moved or not exact:
                    if rounds < NEWTON_ROUNDS:
                        rounds += 1
                        continue
                    local = _classify(obj, x)
            break
        saddles.append(_saddle_record(obj, x, local.eigs[0], obj.n))
        if _stalled(saddles) or attempt == max_escapes:
            break
        attempt += 1
        x = escape(obj, x, local.vecs[:, 0])
    return x, local, saddles


def _rough_descent(obj: PairwiseError, view: object, x: np.ndarray, maxiter: int,
                   bound: float) -> np.ndarray:
    """L-BFGS on ``view`` (``obj`` or its face) at ``obj.descent_level`` to ``POLISH_GTOL``:
    the long way from the start at 0.75x the cost per gradient of the certificate's level
    0.5625 (0.37x that of 0.75; its gradient error, 5e-12 against level 1 at H = 8, is far
    below the 1e-6 where this stops; :func:`_descend` then continues at ``obj.level``, where
    L-BFGS takes few steps more)."""
    with obj.at_descent_level():
        return _minimise(view, x, maxiter, bound, POLISH_GTOL)[0]


def _on_face(obj: PairwiseError, x0: np.ndarray, tol: float, max_escapes: int, maxiter: int
             ) -> tuple[np.ndarray, "_Local | None", list[dict]]:
    """:func:`_descend` on the face P = 0 (:class:`ZeroOrthogonal`) from x0's M, a, b, then the
    P-block 2 G_Q: (full-space point, classification of the full Hessian — None when the
    face's point is no minimum of the full space —, saddles passed).  A P-block with a
    negative eigenvalue makes the point a saddle of the full space, left along that direction
    (the saddle is recorded and the returned point is the escaped one)."""
    face = ZeroOrthogonal(obj)
    xr0 = _rough_descent(obj, face, face.restrict(x0), maxiter, runoff_bound(x0))
    xr, local, saddles = _descend(face, xr0, tol, max_escapes, maxiter, runoff_bound(x0))
    x = face.embed(xr)
    if local is None or local.kind not in STABLE_KINDS:
        return x, None, saddles
    eigs, vecs, fd_err = face.orthogonal_curvature(xr)
    etol = max(_eig_tol(eigs), fd_err, local.eig_tol)
    direction = face.orthogonal_direction(vecs[:, 0])
    if eigs[0] > etol or (eigs[0] >= -etol and _probe(obj, x, direction)):
        kind = local.kind if eigs[0] > etol else "degenerate minimum"
        low = float(min(local.eigs[0], eigs[0]))
        return x, dataclasses.replace(local, kind=kind, eigs=np.array([low]), eig_tol=etol,
                                      zero_modes=0), saddles
    saddles.append(_saddle_record(obj, x, eigs[0], face.n))
    return escape(obj, x, direction), None, saddles


def _saddle_record(obj: KeySpace, x: np.ndarray, min_eigenvalue: float, points: object
                   ) -> dict:
    """What a run reports of a saddle it escaped: E there, the negative curvature, the
    objective's points and the state."""
    return {"sampled_error": obj.value_and_grad(x)[0], "min_eigenvalue": float(min_eigenvalue),
            "points": points, "state": obj.state(x).to_dict()}


def polish_gradient_flow(obj: PairwiseError, x0: np.ndarray, tol: float = DRIFT_TOL,
                         max_escapes: int = 2, maxiter: int = 500,
                         face: bool = True) -> FixedPoint:
    """A certified local minimum of the deterministic E (:class:`PairwiseError`) from x0 (e.g.
    the sampled solution, or where the flow handed over).

    First (``face``) on the face P = 0 of key space (:class:`ZeroOrthogonal`: H·F coordinates,
    the full Hessian block-diagonal there), then, when the point found is no minimum of the
    full space (a negative eigenvalue of 2 G_Q) or the face's descent fails, in the full key
    space from there.  Each stage is L-BFGS at the coarser ``obj.descent_level``
    (:func:`_rough_descent`), then the loop of :func:`solve_gradient_flow` at ``obj.level``
    (:func:`_descend`: L-BFGS, Hessian by head-local finite differences of the exact gradient
    with their error, saddles escaped, trust-region Newton).  Certificate: ``drift_norm`` = ½‖∂E/∂x‖ (full space)
    against ½ ``tol`` (as the sampled solver's), ``drift_stderr`` = ½ its abs_err (two
    resolutions of every sub-model, ``PairwiseError.evaluate``); a gradient whose error exceeds
    ``tol`` cannot certify (kind "gradient unresolved"); the eigenvalue tolerance is the larger
    of :func:`_eig_tol` and the finite-difference errors.  ``sampled_error`` of the result holds
    the deterministic E (no samples), ``error_abs_err`` its abs_err."""
    start, evals0 = time.perf_counter(), obj.evaluations
    local, saddles, where = None, [], "full key space"
    x, view = x0, obj
    if face:
        x, local, saddles = _on_face(obj, x0, tol, max_escapes, maxiter)
        where, view = "the face P = 0 (full Hessian block-diagonal there)", ZeroOrthogonal(obj)
    if local is None:
        view = obj
        x = _rough_descent(obj, obj, x if face else x0, maxiter, runoff_bound(x0))
        x, local, more = _descend(obj, x, tol, max_escapes, maxiter, runoff_bound(x0))
        saddles += more
        where = "full key space" + (" (after the face P = 0)" if face else "")
    if obj.beyond_cap(x):      # never certified, and E is not evaluated there
        value, grad = obj.value_and_grad(x)
        cert = Certificate(0.5 * float(np.linalg.norm(grad)), 0.5 * tol, float("nan"),
                           float("nan"), RUNOFF, 0)
        return FixedPoint(obj.state(x), cert, f"beyond the key cap {KEY_CAP:g} of the "
                          "deterministic E", value, saddles, obj.evaluations - evals0,
                          time.perf_counter() - start, error_abs_err=float("inf"))
    x, (value, value_err, grad, grad_err) = _at_finer_levels(obj, view, x, local, tol)
    if local is None:
        cert = Certificate(0.5 * float(np.linalg.norm(grad)), 0.5 * tol, float("nan"),
                           float("nan"), RUNOFF, 0, 0.5 * grad_err)
    else:
        kind = GRADIENT_UNRESOLVED if grad_err > tol and local.kind in STABLE_KINDS \
            else local.kind
        cert = Certificate(0.5 * float(np.linalg.norm(grad)), 0.5 * tol, float(local.eigs[0]),
                           local.eig_tol, kind, local.zero_modes, 0.5 * grad_err)
    solver = (f"L-BFGS + Newton on K = [M | P], {where} (Hessian by finite differences of "
              f"the exact gradient) on the deterministic E ({obj.n}, level "
              f"{obj.level:g}; L-BFGS first at level {obj.descent_level:g})")
    return FixedPoint(obj.state(x), cert, solver, value, saddles, obj.evaluations - evals0,
                      time.perf_counter() - start, error_abs_err=value_err)


def _at_finer_levels(obj: PairwiseError, view: object, x: np.ndarray, local: "_Local | None",
                     tol: float) -> tuple[np.ndarray, tuple]:
    """(x, ``obj.evaluate(x)``) after trust-region Newton at each finer level of the ladder
    (``pairwise.LEVELS`` above ``obj.level``, on ``view``: ``obj`` or its face, with the
    Hessian at hand) while x is a stable point whose certificate's gradient — taken by
    ``evaluate`` at the first rung that resolves it, often finer than ``obj.level`` — is above
    ``tol`` though resolved.  Why: the descent's level can be off by more than tol there
    (measured: 1.2e-8 in ∂E/∂m of a plain-softmax head, F = 2, ν = 2, L = 5, H = 1, level
    0.5625 against 0.75 and 1, which agree to 3e-13), so Newton at that level stops where the
    certificate cannot pass."""
    face = view is not obj
    evaluated = obj.evaluate(x, tol)
    for level in obj.finer_levels():
        norm, grad_err = float(np.linalg.norm(evaluated[2])), evaluated[3]
        # a degenerate minimum's Hessian may not be positive definite (softmax-1, F = 2,
        # ν = 0.5, H = 4 crashed the trust step here)
        if local is None or local.kind not in STABLE_KINDS or norm <= tol or grad_err > tol \
                or not _newton_ready(local):
            break
        with obj.at_level(level):
            y, _ = _newton(view, view.restrict(x) if face else x, local.Z, local.Hq, tol)
        x = view.embed(y) if face else y
        evaluated = obj.evaluate(x, tol)
    return x, evaluated


def _runoff_certificate(obj: SampledError, x: np.ndarray, tol: float) -> Certificate:
    """The certificate of a descent stopped at ‖x‖ > :func:`runoff_bound`: kind
    ``RUNOFF``, no Hessian (eigenvalue NaN), never certified."""
    g = obj.value_and_grad(x)[1]
    return Certificate(0.5 * float(np.linalg.norm(g)), 0.5 * _drift_tol(x, tol), float("nan"),
                       float("nan"), RUNOFF, 0)


RUNOFF_GROWTH = 10.0    # a head whose norm grew by this factor over the descent is diverging
RAY_TOP = 1e3           # largest factor of the ray profile (≈ the hard-attention limit)
ARTEFACT = "sample artefact"
FALLS = "falls towards infinite key norm"
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class RunoffCheck:
    """The population's view of a run-off, on a held-out point set.

    The diverging heads (norm grown ``RUNOFF_GROWTH``-fold from the start) are scaled by a
    common factor c along their own directions, K_h → c K_h, the other heads kept: c = 1 is the
    run-off end point, c < 1 pulls them back towards their starting norms, c = ``RAY_TOP`` is
    close to the hard-attention limit (softmax → argmax along those heads, E − E_lim = O(1/c)).
    ``rise[i]`` = E_B(c_i) − E_B(1) on the held-out set B (a sample set the descent never saw)
    with its paired standard error (per noise draw differences, an upper bound for Sobol
    points).  ``verdict``:

    * ``ARTEFACT``: some c < 1 is lower than the end point by more than 3 standard errors —
      the held-out E rises along the run-off, so the descent followed its own sample set
      (measured at F = 4, ν = 10, softmax H = 4: the end points of 2^14 tilted points lie
      4.8–8.4e-4 ± 1e-4 above the symmetric state by fresh Monte Carlo);
    * ``FALLS``: every c < 1 is higher than the end point by more than 3 standard errors and
      no c > 1 is higher by more than 3 — E_B keeps falling towards the hard limit, a candidate
      infimum at infinite key norm (never certified by this check alone);
    * ``INCONCLUSIVE`` otherwise."""

    heads: list[int]
    factors: list[float]
    rise: list[float]
    stderr: list[float]
    verdict: str
    points: int
    seed: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def runoff_check(held_out: SampledError, x_end: np.ndarray, x_start: np.ndarray,
                 n_factors: int = 9) -> RunoffCheck:
    """:class:`RunoffCheck` of a descent from ``x_start`` that ran off to ``x_end``, on
    ``held_out`` (an objective with the same settings and another seed).  Costs ``n_factors``
    + 2 value evaluations (weights only) on ``held_out``."""
    K, a, b = held_out.unpack(x_end)
    K0 = held_out.unpack(x_start)[0]
    norms, norms0 = np.linalg.norm(K, axis=1), np.linalg.norm(K0, axis=1)
    heads = [int(h) for h in np.flatnonzero(norms > RUNOFF_GROWTH * np.maximum(1.0, norms0))]
    if not heads:           # ‖x‖ ran off through a, b or evenly: the largest head
        heads = [int(np.argmax(norms))]
    low = float(np.max(np.maximum(1.0, norms0[heads]) / norms[heads]))
    factors = sorted(set(np.geomspace(min(low, 1.0), RAY_TOP, n_factors).tolist()) | {1.0})
    base = held_out.draw_values(x_end)
    rise, err = [], []
    for c in factors:
        Kc = K.copy()
        Kc[heads] *= c
        diff = held_out.draw_values(held_out.pack(Kc, a, b)) - base
        rise.append(float(np.mean(diff)))
        err.append(float(np.std(diff, ddof=1) / np.sqrt(len(diff))) if c != 1.0 else 0.0)
    rise_a, err_a, fac = np.array(rise), np.array(err), np.array(factors)
    verdict = INCONCLUSIVE
    inner, outer = fac < 1.0, fac > 1.0
    if np.any(rise_a[inner] < -3.0 * err_a[inner]):
        verdict = ARTEFACT
    elif np.all(rise_a[inner] > 3.0 * err_a[inner]) and np.all(
            rise_a[outer] <= 3.0 * err_a[outer]):
        verdict = FALLS
    return RunoffCheck(heads, factors, rise, err, verdict, held_out.n, held_out.seed)


def _presolve(obj: SampledError, coarse: SampledError, x: np.ndarray, max_escapes: int,
              maxiter: int, bound: float, key_bound: float = np.inf
              ) -> tuple[np.ndarray, list[dict]]:
    """The descent loop of :func:`solve_gradient_flow` (L-BFGS, quotient Hessian, escapes) on
    ``coarse``; returns (start for ``obj``, the coarse saddles passed).  Its point is kept only
    when it did not run off (``bound``) and ``obj``'s E is lower there than at x: a sample set
    4x smaller can have minima the keys fit (rare events at strong signal) that the full set
    does not, and then the full solve starts from x as without it."""
    y, saddles = x, []
    for attempt in range(max_escapes + 1):
        y, ran_off = _minimise(coarse, y, maxiter, bound, key_bound=key_bound)
        if ran_off:
            return x, []
        local = _classify(coarse, y)
        if local.kind != "saddle":
            break
        saddles.append(_saddle_record(coarse, y, local.eigs[0], coarse.n))
        if _stalled(saddles) or attempt == max_escapes:
            break
        y = escape(coarse, y, local.vecs[:, 0])
    if obj.value_and_grad(y)[0] < obj.value_and_grad(x)[0]:
        return y, saddles
    return x, []


def _stalled(saddles: list[dict], rtol: float = 1e-9) -> bool:
    """Whether the last escape gained nothing: the saddle it reached lies within
    rtol·max(1, |E|) of the one it left.  Measured at F = 4, ν = 10, H = 4 on 2^11 points: four
    escapes lowered E by 3e-11 in all while the keys ran off to |K| ~ 500 (a sampled objective
    flat at large keys); further escapes only cost (~10 s each) and the point stays a saddle."""
    if len(saddles) < 2:
        return False
    before, after = saddles[-2]["sampled_error"], saddles[-1]["sampled_error"]
    return before - after <= rtol * max(1.0, abs(before))


def escape(obj: SampledError, x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The lower of x ± h v for the largest probe step h (``PROBE_STEPS`` × :func:`step_scale`)
    that lowers E (the smallest step if none does)."""
    e0 = obj.value_and_grad(x)[0]
    scale = step_scale(x)
    for h in PROBE_STEPS:
        cands = [x + s * h * scale * v for s in (1.0, -1.0)]
        vals = [obj.value_and_grad(c)[0] for c in cands]
        if min(vals) < e0:
            return cands[int(np.argmin(vals))]
    return x + PROBE_STEPS[-1] * scale * v


def check_objective(cert: Certificate, sampled: float, sampled_stderr: float, precise: float,
                    precise_err: float) -> Certificate:
    """The certificate, demoted to kind "objective unreliable" when the sampled objective
    disagrees with the precise E at the solution: |E_n − E| > 4 (stderr(E_n) + abs_err(E)) +
    1e-3 |E|.  This catches a sample set that the keys can separate: at strong signal
    (e.g. F = 4, ν = 10) the minimiser of E_n runs off to large keys where E_n → 0 while the
    population E rises — a minimum of the sampled function, not of E."""
    bound = 4.0 * (sampled_stderr + precise_err) + 1e-3 * abs(precise)
    if abs(sampled - precise) <= bound or cert.kind not in STABLE_KINDS:
        return cert
    return dataclasses.replace(cert, kind="objective unreliable")


def certify(obj: SampledError, x: np.ndarray, tol: float = DRIFT_TOL) -> Certificate:
    """The certificate of the point x as it is (no solving): drift norm and quotient Hessian.

    x, not a state: the sampled objective is a function of K (its gauge invariance is that of
    the population E, exact only as n → ∞), so re-factorising a state moves the point."""
    return _certificate(obj, x, _classify(obj, x), tol)


# ----------------------------------------------------------------------------- finite γ
@dataclass
class DriftMap:
    """The ODE's right-hand side as a map of the free coordinates y (finite γ).

    y = (M raveled, upper triangle of Q with its diagonal, a if trained, b if trained): the
    coordinates the drift moves (untrained a, b would be exact zero rows of the Jacobian).
    ``system`` is an ``ode.OdeSystem`` (fixed-sample engine: a smooth deterministic map)."""

    system: object
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
