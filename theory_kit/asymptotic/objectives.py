"""The objectives of the E∞ solvers: E as a smooth function of the keys, on fixed samples
(docs/theory.md §4, §6).

Coordinates (:class:`KeySpace`), in which every point is an admissible state: the keys live in
R^{F+H},

    K = [M | P] ∈ R^{H×(F+H)},   M = K[:, :F],   Q = K Kᵀ,   Q − M Mᵀ = P Pᵀ ⪰ 0,

and the solvers work on the flat x = (K, a if trained, b of the free heads if trained).  E
depends on K only through K Kᵀ, so it is invariant under the gauge K → [M | P R], R ∈ O(H);
at K the orbit's tangent space is spanned by δK = [0 | P A], A antisymmetric
(:func:`gauge_directions`), and the certificate takes the Hessian on the quotient,
Zᵀ ∇²E Z with Z an orthonormal basis of the orthogonal complement (:func:`quotient_basis`;
exact Hessian-vector products on the sampled E, :meth:`SampledError.hessian_products`;
:func:`fd_hessian`, central differences of the exact gradient, where no products exist).

The sampled objective (:class:`SampledError`) is E on fixed samples (common random numbers:
scrambled Sobol points by default, :func:`sobol_normals`, with an importance tilt of the token
noise at strong signal), a smooth deterministic function with its exact gradient,

    ∂E/∂K_h = −2 E[Σ_l g_{hl} G_l] − 4 E[ρ_h] K_h,

for L-BFGS, and its exact curvature (forward over reverse through the generated kernels) for
Newton and the certificate.  The Bayes posterior p_l = P(ε = l | X)
(:func:`bayes_posterior`) is a control variate, so that what is minimised is the excess

    E_n = Δ + Σ_i ω_i [(1 − ‖p_i‖²) + ‖w_i − p_i‖²],   E_n − E_Bayes,n = Σ_i ω_i ‖w_i − p_i‖² ≥ 0.

Sums over the samples use NumPy's own loops, never BLAS (:func:`sample_sum`), so that their
rounding does not depend on the thread count.  ``DRIFT_TOL`` and ``FD_STEP`` are shared
downstream: the default drift tolerance of the evaluations and certificates, and the relative
finite-difference step of the Hessians and Jacobians.

See Also
--------
theory_kit.asymptotic.deterministic : the deterministic E on the same coordinates (no samples).
theory_kit.asymptotic.certificate : the classification of a point of these objectives.
theory_kit.asymptotic.gradient_flow : their local minima, solved for.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from scipy import special
from scipy.stats import qmc

from ..expect import montecarlo as mc
from ..expect.error import log_bayes_factor, squared_residual
from ..io.progress import tick
from ..kernels import sample_kernels
from ..model.activations import Activation
from ..model.priors import Prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import fail

POINTS = ("sobol", "mc")
DRIFT_TOL = 1e-8
FD_STEP = 1e-6          # relative finite-difference step of the Hessian / Jacobian


# ----------------------------------------------------------------------------- key space
@dataclass
class KeySpace:
    """The solver's coordinates x = (K, a if trained, b of the free heads if trained),
    K = [M | P] ∈ R^{H×(F+H)}, Q = K Kᵀ; untrained a, b stay at ``a0``, ``b0``, and so do the b
    of the heads in ``frozen_b`` (a boundary b_h = +∞ represented at a finite b, module
    ``saturation``).  The fields (task, act, H, a0, b0, train_a, train_b) come first in the
    sampled objective and the deterministic one (:class:`deterministic.PairwiseError`)."""

    task: Task
    act: Activation
    H: int
    a0: np.ndarray
    b0: np.ndarray
    train_a: bool
    train_b: bool
    frozen_b: tuple[int, ...] = ()

    if TYPE_CHECKING:  # every objective defines these (SampledError, DeterministicError's)
        def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]: ...

        def hessian(self, x: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, float]: ...

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


class Objective(Protocol):
    """What the descent and certificate routines (``gradient_flow``, ``certificate``) call: a
    :class:`KeySpace` objective, or E on the face P = 0 (``deterministic.ZeroOrthogonal``)."""

    @property
    def dim(self) -> int: ...

    def value_and_grad(self, x: np.ndarray, /) -> tuple[float, np.ndarray]: ...

    def hessian(self, x: np.ndarray, Z: np.ndarray, /) -> tuple[np.ndarray, float]: ...

    def quotient(self, x: np.ndarray, /) -> np.ndarray: ...

    def state(self, x: np.ndarray, /) -> State: ...


def max_key_norm(obj: KeySpace, x: np.ndarray) -> float:
    """The largest key norm max_h |k_h| of x."""
    return float(np.max(np.linalg.norm(obj.unpack(x)[0], axis=1)))


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
    products: int = field(default=0, init=False)          # Hessian-vector products
    # the last point's weights pass, shared by its gradient and its Hessian products
    _last: tuple = field(default=(), init=False, repr=False, compare=False)

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
        g[:, :F, :] += np.where(shifted[:, None, :],
                                mus[np.clip(comp, 0, None)].transpose(0, 2, 1), 0.0)
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
        of ``kernels.sample_kernels`` (numba, or NumPy without it)."""
        K, a, W, D, D2, w, e = self._forward(x)
        return (K, w, e) + tuple(sample_kernels(self.act).vjp(W, D, D2, a, e))

    def _forward(self, x: np.ndarray) -> tuple:
        """(K, a, W, D, D2 (n, H, L), w, e (n, L)) at x: the weights pass of every derivative,
        kept for the last x (trust-region Newton asks the gradient, then several products at
        one point)."""
        return self._at(x)[0]

    def _at(self, x: np.ndarray) -> tuple[tuple, dict]:
        """(:meth:`_forward`'s tuple, a dict of further sums at x) for the last x."""
        if self._last and np.array_equal(self._last[0], x):
            return self._last[1], self._last[2]
        self._last = ()                 # freed before the new pass: no higher peak memory
        x = np.array(x, float)          # a copy: K, a below are views of it
        K, a, b = self.unpack(x)
        W, D, D2, w = sample_kernels(self.act).weights(self.scores(K), b, np.sum(K * K, axis=1),
                                                       a)
        self._last = (x, (K, a, W, D, D2, w, self.target - w), {})
        return self._last[1], self._last[2]

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
        """(Zᵀ ∇²E Z from exact products (:meth:`hessian_products`), symmetrised; its asymmetry
        max |Hq − Hqᵀ|, the round-off of the products).  Shape (k, k), k = Z.shape[1]."""
        Hq = Z.T @ self.hessian_products(x, Z)
        return 0.5 * (Hq + Hq.T), float(np.max(np.abs(Hq - Hq.T), initial=0.0))

    def hvp(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The exact Hessian-vector product ∇²E(x) u, shape (dim,) (see
        :meth:`hessian_products`).

        >>> from theory_kit.model.activations import get_activation
        >>> from theory_kit.model.priors import make_prior
        >>> obj = SampledError.for_activation(Task(3, make_prior("flipping", nu=[1.0])),
        ...                                   get_activation("softmax"), 1, n=64)
        >>> x, u = np.array([1.0, 0.5]), np.array([0.0, 1.0])
        >>> h, grad = 1e-6, lambda y: obj.value_and_grad(y)[1]
        >>> fd = (grad(x + h * u) - grad(x - h * u)) / (2 * h)
        >>> bool(np.allclose(obj.hvp(x, u), fd, atol=1e-8))
        True
        """
        return self.hessian_products(x, np.asarray(u, float)[:, None])[:, 0]

    def hessian_products(self, x: np.ndarray, U: np.ndarray) -> np.ndarray:
        """∇²E(x) U for directions U (dim, k), shape (dim, k): one weights pass at x, then per
        column the generated second-order kernel (``kernels`` ``tangent``) and one VJP.

        Forward over reverse: with e = target − w, the gradient is g = −2 Σ ω X(x, e) for the
        VJP outputs X = (J·e, ∂w/∂a·e, ∂w/∂b·e, ∂w/∂Q_hh·e); along u = (δK, δa, δb), with
        δS_hl = δK_h·G_l, δq_h = 2 K_h·δK_h and δw the JVP of w,

            δX = X'(x, e)[u] + X(x, −δw)          (X is linear in e),
            δ(∂E/∂K_h) = −2 E[Σ_l δ(J·e)_hl G_l] − 4 E[δρ_h] K_h − 4 E[ρ_h] δK_h,

        and δ(∂E/∂a), δ(∂E/∂b) = −2 E[δ(∂w/∂a·e)], −2 E[δ(∂w/∂b·e)] (ρ_h = ∂w/∂Q_hh·e)."""
        (K, a, W, D, D2, w, e), sums = self._at(x)
        kern = sample_kernels(self.act)
        if "rho" not in sums:
            sums["rho"] = sample_sum(self.samples.weights, kern.vjp(W, D, D2, a, e)[3])
        forward = (K, a, W, D, D2, e, sums["rho"])
        cols = []
        for u in np.asarray(U, float).T:
            cols.append(self._product(forward, kern, u))
            self.products += 1
            tick(products=len(cols))   # one a column: the bar moves during a large Hessian
        return np.column_stack(cols) if cols else np.zeros((len(x), 0))

    def _product(self, forward: tuple, kern, u: np.ndarray) -> np.ndarray:
        """One column of :meth:`hessian_products` from the shared forward pass."""
        K, a, W, D, D2, e, rho = forward
        dK, dS, da, db, dq = self._direction(K, u)
        dw, *fixed = kern.tangent(W, D, D2, a, e, dS, da, db, dq)
        dJ, dA, dB, dQ = (f + g for f, g in zip(fixed, kern.vjp(W, D, D2, a, -dw)))
        wts = self.samples.weights
        gK = (-2.0 * self.token_contraction(dJ * wts[:, None, None])
              - 4.0 * sample_sum(wts, dQ)[:, None] * K - 4.0 * rho[:, None] * dK)
        return self.pack(gK, -2.0 * sample_sum(wts, dA), -2.0 * sample_sum(wts, dB))

    def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """(E, ∂E/∂x) on the fixed samples."""
        self.evaluations += 1
        K, w, e, Jv, Av, Bv, Qv = self._per_sample(x)
        wts = self.samples.weights
        value = self.floor + float(sample_sum(wts, np.sum(e ** 2, axis=1)))
        dK = (-2.0 * self.token_contraction(Jv * wts[:, None, None])
              - 4.0 * sample_sum(wts, Qv)[:, None] * K)
        grad = self.pack(dK, -2.0 * sample_sum(wts, Av), -2.0 * sample_sum(wts, Bv))
        tick(E=value, grad=float(np.linalg.norm(grad)))
        return value, grad

    def _direction(self, K: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, ...]:
        """u (dim,) as the kernels' direction at keys K: (δK (H, F+H), δS (n·reps, H, L),
        δa, δb (H,; 0 where not a coordinate), δq_h = 2 K_h·δK_h)."""
        dK, da, db = self.unpack(u)
        da = da if self.train_a else np.zeros(self.H)
        db = np.where(np.isin(np.arange(self.H), self.free_b), db, 0.0)   # b0 elsewhere
        return dK, self.scores(dK), da, db, 2.0 * np.sum(K * dK, axis=1)

    def curvature_stderr(self, x: np.ndarray, u: np.ndarray) -> float:
        """Standard error of the curvature uᵀ∇²E u at x as if the n noise draws were
        independent (θ strata of a draw summed first; for Sobol points an upper bound): how far
        from the sampled curvature the population's may be.

        Per row, with δw the JVP of w and e·δ²w from the second-order kernel at fixed e
        (ρ_h = ∂w/∂Q_hh·e, δ²q_h = 2 |δK_h|²),

            uᵀ∇²E_i u = 2 ω_i (|δw_i|² − e_i·δ²w_i),
            e·δ²w = Σ_hl δ(J·e)_hl δS_hl + Σ_h [δ(∂w/∂a·e)_h δa_h + δ(∂w/∂b·e)_h δb_h
            + δρ_h δq_h + 2 ρ_h |δK_h|²]."""
        (K, a, W, D, D2, _, e), _ = self._at(x)
        kern = sample_kernels(self.act)
        dK, dS, da, db, dq = self._direction(K, np.asarray(u, float))
        dw, dJ, dA, dB, dQ = kern.tangent(W, D, D2, a, e, dS, da, db, dq)
        rho = kern.vjp(W, D, D2, a, e)[3]
        second = (np.sum(dJ * dS, axis=(1, 2)) + dA @ da + dB @ db + dQ @ dq
                  + 2.0 * rho @ np.sum(dK * dK, axis=1))
        draws = self._draw_sums(2.0 * self.samples.weights * (np.sum(dw * dw, axis=1) - second))
        return float(np.std(draws, ddof=1) / np.sqrt(len(draws)))

    def _draw_sums(self, per_row: np.ndarray) -> np.ndarray:
        """Per-row values (n·reps, ...) summed per noise draw (its θ strata), times the number
        of draws so that their mean is the total; shape (n, ...)."""
        groups = np.zeros((self.samples.n_groups,) + per_row.shape[1:])
        np.add.at(groups, self.samples.group, per_row)
        return groups * self.samples.n_groups

    def draw_values(self, x: np.ndarray) -> np.ndarray:
        """The summand of E_n − Δ per noise draw (θ strata of a draw summed), scaled so that
        their mean is E_n − Δ; shape (n,).  Weights only (no VJP): the cheap path for
        standard errors and paired comparisons of two points on one sample set."""
        K, a, b = self.unpack(x)
        w = sample_kernels(self.act).weights(self.scores(K), b, np.sum(K * K, axis=1), a)[3]
        return self._draw_sums(self.samples.weights * self._per_sample_value(w, self.target - w))

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
        groups = self._draw_sums(self.samples.weights[:, None] * per)
        return float(np.sqrt(np.sum(groups.var(axis=0, ddof=1)) / len(groups)))


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
def gauge_directions(obj: KeySpace, x: np.ndarray) -> np.ndarray:
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
