"""The two exact methods of finite-D online SGD, step by step (docs/theory.md §7).

The random numbers of a block of steps (tokens, Wishart factors of the remainders' Gram
matrix), the SGD coefficients β, ρ and the scalar gradients from the generated per-sample
kernels, and the state each method advances: :class:`ReducedState` (the Gram matrix of
{u_f, k_h}: M and O = Q − M Mᵀ, with the key coordinates [M | P]) and :class:`BruteState`
(explicit keys).  The laws, the stream layout and the update are described in
:mod:`theory_kit.dynamics.simulate`, which runs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import kernels
from ..model.activations import Activation
from ..model.initial import InitialCondition, keys_from_state
from ..model.task import Task
from .sgd_step import (
    FAULT_NONE,
    FAULT_NONFINITE,
    FAULT_NORMALISER,
    VJP_SIG,
    WEIGHTS_SIG,
    coefficients_stack,
    psd_factor,
    reduced_block,
    tokens_stack,
)

# random numbers drawn at once for a block of reduced steps (bounds memory, amortises calls)
BLOCK_FLOATS = 400_000

if TYPE_CHECKING:
    from .simulate import SimConfig


# ----------------------------------------------------------------------------- random pieces
@dataclass
class WishartDraws:
    """The random numbers of Wishart factors (leading axes ``size``), in the order drawn.

    Bartlett (dof ≥ p): tri (…, p(p−1)/2) below the diagonal in ``np.tril_indices(p, -1)``
    order and chi (…, p) ~ χ²(dof − i); gauss is then (…, p, 0).  Otherwise gauss (…, p, dof)
    and tri, chi have length 0."""

    tri: np.ndarray
    chi: np.ndarray
    gauss: np.ndarray


def wishart_draws(rng: np.random.Generator, dof: int, size: tuple[int, ...],
                  p: int) -> WishartDraws:
    """The draws of :func:`wishart_factor`: one standard_normal call of shape size + (p(p−1)/2,)
    then one chisquare call of shape size + (p,) (Bartlett), or one standard_normal call of
    shape size + (p, dof).  A bulk draw of shape (k, n) equals k successive draws of n, so the
    stream does not depend on how steps are grouped into blocks of draws beyond the calls."""
    if dof >= p:
        tri = rng.standard_normal(size + (p * (p - 1) // 2,))
        chi = rng.chisquare(dof - np.arange(p), size=size + (p,))
        return WishartDraws(tri, chi, np.empty(size + (p, 0)))
    return WishartDraws(np.empty(size + (0,)), np.empty(size + (0,)),
                        rng.standard_normal(size + (p, dof)))


def wishart_factor(rng: np.random.Generator, dof: int, size: tuple[int, ...], p: int) -> np.ndarray:
    """A factor A (size × p × k) with A Aᵀ ~ Wishart_p(dof, I), independently over ``size``.

    dof ≥ p: Bartlett decomposition, A lower triangular with A_ii = √χ²(dof − i) (i = 0..p−1)
    and N(0, 1) below the diagonal.  0 ≤ dof < p: A = Gᵀ with G a dof × p Gaussian matrix.
    Assembled in NumPy from :func:`wishart_draws` (the compiled step loop assembles the same
    factor itself, :func:`sgd_step.tokens_stack`)."""
    draws = wishart_draws(rng, dof, size, p)
    if dof < p:
        return draws.gauss
    A = np.zeros(size + (p, p))
    rows, cols = np.tril_indices(p, -1)
    A[..., rows, cols] = draws.tri
    diag = np.arange(p)
    A[..., diag, diag] = np.sqrt(draws.chi)
    return A


@dataclass
class TokenDraws:
    """The token randomness of a block of reduced steps, leading axes (steps, runs): coords
    (…, L, F + H) = [p | q] before the signal θ is added, and the draws of the Wishart_p
    factor (p = min(H, L)) of the step (module docstring)."""

    coords: np.ndarray
    wishart: WishartDraws

    def assembled(self, smp: "Samples") -> tuple[np.ndarray, np.ndarray]:
        """The tokens [p | q] (…, L, F + H) with θ added at the signal, and the Wishart_p
        factors B (…, p, k), assembled by the compiled code of the step loop."""
        wd = self.wishart
        m, R, L, FH = self.coords.shape
        p = wd.gauss.shape[-2]
        k = p if wd.chi.shape[-1] else wd.gauss.shape[-1]
        T, B = np.empty((m, R, L, FH)), np.empty((m, R, p, k))
        tokens_stack(self.coords, _contiguous(smp.theta), smp.eps, wd.tri, wd.chi, wd.gauss,
                     T, B)
        return T, B


def _contiguous(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=float)


@dataclass
class Samples:
    """The token-independent randomness of a block of steps, leading axes (steps, runs)."""

    eps: np.ndarray    # signal location ε
    theta: np.ndarray  # (…, F)
    c: np.ndarray      # values (…, L)
    xi: np.ndarray     # label noise
    y: np.ndarray      # labels y = c_ε + √Δ ξ


def squared_errors(eps: np.ndarray, w: np.ndarray, delta: float) -> np.ndarray:
    """Δ + |δ_ε − w|² for signal locations eps (…) and token weights w (…, L)."""
    e = -w
    np.put_along_axis(e, eps[..., None], np.take_along_axis(e, eps[..., None], -1) + 1.0, -1)
    return delta + np.einsum("...l,...l->...", e, e)


def draw_samples(task: Task, rng: np.random.Generator, steps: int, runs: int) -> Samples:
    """ε uniform on the L tokens, θ from the prior, values and label noise standard normal."""
    eps = rng.integers(0, task.L, size=(steps, runs))
    theta = task.prior.sample(rng, steps * runs).reshape(steps, runs, task.F)
    c = rng.standard_normal((steps, runs, task.L))
    xi = rng.standard_normal((steps, runs))
    y = np.take_along_axis(c, eps[..., None], -1)[..., 0] + np.sqrt(task.delta) * xi
    return Samples(eps, theta, c, xi, y)


# ----------------------------------------------------------------------------- SGD coefficients
def step_kernels(act: Activation) -> Any:
    """The generated per-sample kernels of ``act`` (:func:`kernels.sample_kernels`), compiled
    for the array layout of :mod:`theory_kit.dynamics.sgd_step` (a no-op once cached)."""
    kern = kernels.sample_kernels(act)
    kern.weights1.compile(WEIGHTS_SIG)
    kern.vjp1.compile(VJP_SIG)
    return kern


@dataclass
class StepCoefficients:
    """One step's update coefficients (runs first): k_h ← (1+ρ_h) k_h + Σ_l β_{hl} x_l,
    a_h ← a_h + da_h, b_h ← b_h + db_h (ρ, da, db are 0 when they vanish)."""

    beta: np.ndarray   # (R, H, L)
    rho: np.ndarray    # (R, H)
    da: np.ndarray     # (R, H)
    db: np.ndarray     # (R, H)
    w: np.ndarray      # (R, L) token weights, for the running error
    ok: bool = True    # False when a normaliser κ + Σφ was ≤ 0 (weights NaN)


def step_coefficients(kernels: Any, S: np.ndarray, a: np.ndarray, b: np.ndarray,
                      Qdiag: np.ndarray, c: np.ndarray, y: np.ndarray, rates: np.ndarray,
                      bayes: bool) -> StepCoefficients:
    """SGD coefficients at scores S (R, H, L) for values c (R, L) and labels y (R,), from the
    compiled generated kernels (the same code as the reduced step loop).

    a, b, Qdiag: (R, H), one per run (Qdiag matters only for Bayes offsets).  ``rates`` =
    (γ, γ_a, γ_b)/D, zero for an untrained scalar.  With r = y − w·c and G = J·c:
    β = (γ/D) r G, ρ = (γ/D) r 2 ∂w/∂Q_hh·c, da = (γ_a/D) r ∂w/∂a_h·c, db = (γ_b/D) r ∂w/∂b_h·c."""
    R, H, L = S.shape
    out = StepCoefficients(np.empty((R, H, L)), np.empty((R, H)), np.empty((R, H)),
                           np.empty((R, H)), np.empty((R, L)))
    f8 = lambda x: np.ascontiguousarray(x, dtype=float)  # noqa: E731
    out.ok = coefficients_stack(kernels.weights1, kernels.vjp1, f8(S), f8(a), f8(b), f8(Qdiag),
                                f8(c), f8(y), f8(rates), bool(bayes), out.beta, out.rho, out.da,
                                out.db, out.w)
    return out


# ----------------------------------------------------------------------------- the two methods
class ReducedState:
    """Exact reduced simulation: per run the key coordinates K = [M | P] (H × (F+H)) on
    (u_1..u_F, e_1..e_H), with P Pᵀ = O = Q − M Mᵀ; see the module docstring."""

    def __init__(self, M: np.ndarray, O: np.ndarray, D: int, wishart_dof: int | None = None):
        self.D = D
        H, self.F = M.shape[-2:]
        self.dof = D - self.F - H if wishart_dof is None else wishart_dof
        self._set(M, O)

    def _set(self, M: np.ndarray, O: np.ndarray) -> None:
        # the same factor as the compiled step takes, so a resumed run continues bit for bit
        self.O = np.ascontiguousarray(O, dtype=float)
        self.K = np.ascontiguousarray(np.concatenate([M, psd_factor(self.O)], axis=-1))

    @property
    def M(self) -> np.ndarray:
        return self.K[..., :self.F]

    @classmethod
    def drawn(cls, rng: np.random.Generator, runs: int, H: int, F: int, D: int, eta: float,
              wishart_dof: int | None = None) -> "ReducedState":
        """Law of k_h ~ N(0, η²/D I): m_hf ~ N(0, η²/D), O ~ Wishart_H(D − F, η²/D I)."""
        scale = eta / np.sqrt(D)
        M = rng.standard_normal((runs, H, F)) * scale
        A = wishart_factor(rng, D - F, (runs,), H) * scale
        return cls(M, A @ np.swapaxes(A, -1, -2), D, wishart_dof)

    @classmethod
    def given(cls, ic: InitialCondition, runs: int, D: int,
              wishart_dof: int | None = None) -> "ReducedState":
        st = ic.state
        return cls(np.repeat(st.M[None], runs, 0), np.repeat(st.orthogonal_part()[None], runs, 0),
                   D, wishart_dof)

    def block_steps(self, runs: int, L: int) -> int:
        return max(1, BLOCK_FLOATS // (runs * L * (self.K.shape[-1] + L)))

    def draw_tokens(self, rng: np.random.Generator, steps: int, smp: Samples) -> TokenDraws:
        """Per step and run the draws of the token coordinates [p | q] (L × (F + H)): p on u,
        q on e (θ is added to p at the signal token inside the step loop), and the draws of
        a factor of Wishart_p(D − F − H, I), p = min(H, L), for the Gram matrix of the new
        keys' remainders (module docstring).

        Stream layout of a block (after :func:`draw_samples`): one standard_normal call of
        shape (steps, R, L, F + H), then the calls of :func:`wishart_draws`."""
        R, H, FH = self.K.shape
        L = smp.c.shape[-1]
        coords = rng.standard_normal((steps, R, L, FH))
        return TokenDraws(coords, wishart_draws(rng, self.dof, (steps, R), min(H, L)))

    def steps(self, kernels: Any, smp: Samples, tokens: TokenDraws,
              scalars: "Scalars") -> tuple[int, int]:
        """The block's steps, compiled (:func:`sgd_step.reduced_block`), in place; returns
        (step index, kind) of the earliest failure, kind FAULT_NONE if there was none."""
        fault = np.zeros(2, dtype=np.int64)
        wd = tokens.wishart
        reduced_block(kernels.weights1, kernels.vjp1, self.K, self.O, scalars.a, scalars.b,
                      tokens.coords, _contiguous(smp.theta), smp.eps, wd.tri, wd.chi, wd.gauss,
                      smp.c, _contiguous(smp.y), scalars.rates, scalars.bayes, scalars.delta,
                      scalars.sq_sum, fault)
        return int(fault[0]), int(fault[1])

    def order_parameters(self) -> tuple[np.ndarray, np.ndarray]:
        M = self.M.copy()
        return M, self.O + M @ np.swapaxes(M, -1, -2)

    def to_dict(self) -> dict:
        return {"M": self.M, "O": self.O}

    def load(self, saved: dict) -> None:
        """Restore from :meth:`to_dict` (CorruptCheckpoint on wrong shapes or values)."""
        R, H, _ = self.K.shape
        self._set(_checked_array(saved, "M", (R, H, self.F)), _checked_array(saved, "O", (R, H, H)))


class BruteState:
    """Explicit keys K (runs × H × D); U = the first F coordinate axes."""

    def __init__(self, K: np.ndarray, F: int):
        self.K, self.F = K, F

    @classmethod
    def drawn(cls, rng: np.random.Generator, runs: int, H: int, F: int, D: int,
              eta: float) -> "BruteState":
        return cls(rng.standard_normal((runs, H, D)) * (eta / np.sqrt(D)), F)

    @classmethod
    def given(cls, ic: InitialCondition, runs: int, D: int) -> "BruteState":
        K, _ = keys_from_state(ic.state, D)
        return cls(np.repeat(K[None], runs, 0), ic.state.F)

    def block_steps(self, runs: int, L: int) -> int:
        return 1

    def draw_tokens(self, rng: np.random.Generator, steps: int, smp: Samples) -> np.ndarray:
        """The tokens X (steps × R × L × D) of a one-step block."""
        R, _, D = self.K.shape
        X = rng.standard_normal((R, smp.c.shape[-1], D))
        X[np.arange(R), smp.eps[0], :self.F] += smp.theta[0]
        return X[None]

    def steps(self, kernels: Any, smp: Samples, tokens: np.ndarray,
              scalars: "Scalars") -> tuple[int, int]:
        """The block's steps in NumPy (coefficients from the compiled kernels), in place;
        returns (step index, kind) of the first failure, kind FAULT_NONE if there was none."""
        for i in range(tokens.shape[0]):
            X = tokens[i]
            co = step_coefficients(kernels, self.K @ np.swapaxes(X, -1, -2), scalars.a,
                                   scalars.b, np.sum(self.K ** 2, axis=-1), smp.c[i], smp.y[i],
                                   scalars.rates, scalars.bayes)
            self.K = (1.0 + co.rho[..., None]) * self.K + co.beta @ X
            scalars.a += co.da
            scalars.b += co.db
            scalars.sq_sum += squared_errors(smp.eps[i], co.w, scalars.delta)
            if not co.ok:
                return i, FAULT_NORMALISER
            if not (np.all(np.isfinite(co.w)) and np.all(np.isfinite(scalars.a))
                    and np.all(np.isfinite(scalars.b))):
                return i, FAULT_NONFINITE
        return 0, FAULT_NONE

    def order_parameters(self) -> tuple[np.ndarray, np.ndarray]:
        return self.K[..., :self.F].copy(), self.K @ np.swapaxes(self.K, -1, -2)

    def to_dict(self) -> dict:
        return {"K": self.K}

    def load(self, saved: dict) -> None:
        """Restore from :meth:`to_dict` (CorruptCheckpoint on wrong shapes or values)."""
        self.K = _checked_array(saved, "K", self.K.shape)


@dataclass
class Scalars:
    """What the steps update besides the keys, per run: the trained scalars a, b (R, H) and
    the sum of Δ + |δ_ε − w|² over the steps since the last record (R,); plus the constants
    the steps need (rates = (γ, γ_a, γ_b)/D, Bayes offsets or not, Δ)."""

    a: np.ndarray
    b: np.ndarray
    sq_sum: np.ndarray
    rates: np.ndarray
    bayes: bool
    delta: float

    @classmethod
    def initial(cls, cfg: SimConfig) -> "Scalars":
        if cfg.initial is not None:
            a0, b0 = cfg.initial.state.a, cfg.initial.state.b
        else:
            a0, b0 = cfg.act.a_default(cfg.H, cfg.task.L), cfg.act.b_default(cfg.H, cfg.task.L)
        tile = lambda x: np.ascontiguousarray(np.tile(np.asarray(x, float), (cfg.runs, 1)))  # noqa: E731
        return cls(tile(a0), tile(b0), np.zeros(cfg.runs), cfg.rates(),
                   cfg.act.offset == "bayes", float(cfg.task.delta))


class CorruptCheckpoint(ValueError):
    """Saved progress that cannot be this run's: wrong schema, shapes, or step counts."""


def _checked_array(saved: dict, key: str, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.ascontiguousarray(np.array(saved[key], dtype=float))
    if arr.shape != shape or not np.all(np.isfinite(arr)):
        raise CorruptCheckpoint(f"'{key}' has shape {arr.shape} or non-finite values, "
                                f"expected finite {shape}")
    return arr
