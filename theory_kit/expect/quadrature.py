"""Deterministic quadrature for the population error E(M, Q, a, b) (docs/theory.md §4, §5).

Write the error as E = Δ + 1 − 2 E[w_ε] + E[Σ_l w_l²] with the signal at token 0.  Given
θ the score columns s_{:,l} ∈ R^H are independent Gaussians, N(Mθ, Q) for the signal token
and N(0, Q) for the others; a Gaussian prior folds into the signal column, N(0, Q + M diag(ν) Mᵀ).

Normalised activations.  With 1/N = ∫_0^∞ e^{−tN} dt, 1/N² = ∫_0^∞ t e^{−tN} dt and the
independence of the columns, every term is a t-integral of products of one-column
expectations.  In u = log t (dt = t du), with x_{hl} = u + log φ(t_{hl}) so that tφ = e^x:

    B(u)  = E[exp(−Σ_h e^{x_h})],          A(u) = E[(Σ_h a_h e^{x_h}) exp(−Σ_h e^{x_h})],
    C(u)  = E[(Σ_h a_h e^{x_h})² exp(−Σ_h e^{x_h})]                       (joint: all heads)

    E[w_0]     = ∫ du e^{−κt} A_sig B_noise^{L−1}
    E[Σ_l w_l²] = ∫ du e^{−κt} [C_sig B_noise^{L−1} + (L−1) C_noise B_sig B_noise^{L−2}].

Per-head normalisation uses the same formulas with one head at a time (giving E[W_h0] and
E[Σ_l W_hl²]), and for the cross terms E[Σ_l W_hl W_h'l] the two-variable version
∫∫ du du' e^{−κ(t+t')} [D_sig B2_noise^{L−1} + (L−1) D_noise B2_sig B2_noise^{L−2}] with
B2(u,u') = E[e^{−e^{x_h} − e^{x'_{h'}}}], D(u,u') = E[e^{x_h − e^{x_h}} e^{x'_{h'} − e^{x'_{h'}}}].
The pair (s_h, s_h') is written as s_1 = μ_1 + σ_1 z_1, s_2 = μ_2 + β z_1 + σ_c z_2, so the z_2
average is done once per (u', z_1) and the (u, u') tables are matrix products.
Every factor is bounded (e^{x − e^x} ≤ 1/e), so huge scores cannot overflow.

Elementwise activations need no t: E[w_0] = Σ_h a_h E[φ_h] and
E[w_l²] = Σ_{hh'} a_h a_h' E[φ_h φ_h'].

Rules (documented choices):

* u: trapezoid with step h_u = 0.25/r on [−ψ_max − 32, −ψ_min + 4.5] (ψ = log φ over the
  Gaussian ranges).  The integrands are analytic and bounded in |Im u| < π/2, so the error is
  ~ e^{−π²/h_u}; the cut tails are < e^{−32} (lower, integrand ≤ e^{u+ψ}) and < e^{−e^{4.5}}.
* whitened Gaussian variables z (eigendecomposition of the covariance; only its range is
  integrated, so singular covariances such as M = Q = 0 work): trapezoid on [−8.5, 8.5] with
  step min(0.5, 0.3/(r σ)), σ the largest loading of that direction.  For φ = exp the
  integrand is analytic in |Im z| < π/(2σ), so this converges geometrically.
* elementwise φ (relu, …) may have kinks; there the 1-D Gaussian rule is composite
  Gauss–Legendre on [−10, 10] with the kinks as panel edges, nested for the 2-D terms.
* joint normalisation whose column rank makes the tensor grid too large (default more than
  ``MAX_GRID`` node·u evaluations): scrambled Sobol points (randomised QMC) replace the tensor
  grid, with several independent replicates; their spread is the error estimate.

``quad_error`` runs two resolutions r and 0.75 r and reports the finer value with
abs_err = |difference| (or the RQMC standard error).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, cast

import numpy as np
import sympy as sp
from scipy import special

from ..io.limits import check_memory
from ..model.activations import S_SYMBOL, Activation
from ..model.priors import GaussianPrior
from ..model.state import State
from ..model.task import Task
from ..model.validation import ResourceError, ValidationError

Z_RANGE = 8.5           # trapezoid truncation of the standard normal, e^{−Z²/2} ≈ 2e−16
Z_RANGE_GL = 10.0       # composite Gauss–Legendre truncation (elementwise, polynomial growth)
H_Z = 0.3               # trapezoid step in z, times 1/σ
H_Z_MAX = 0.5           # a pure Gaussian is integrated to 1e−30 with this step
H_U = 0.25              # trapezoid step in u = log t
U_LOW_MARGIN = 32.0     # lower tail of the u-integral ≤ e^{−32}
U_HIGH_MARGIN = 4.5     # upper tail ≤ exp(−e^{4.5})
GL_PANELS, GL_ORDER = 16, 10
MAX_GRID = 4e7          # tensor-grid budget (nodes × u points) before switching to RQMC
# 32 replicates of 2^10 points (the cost of 8 × 2^12): the replicate values are skewed by
# rare large contributions, and 8 of them gave spreads 5x too small (see quad_moments)
RQMC_POINTS_LOG2, RQMC_REPLICATES = 10, 32
COARSE = 0.75           # the second resolution used for the error estimate
MAX_PSI_SPAN = 1000.0   # widest ψ range the u grid covers (beyond: the mass check reports it)
RESOLUTION_RANGE = (0.5, 8.0)  # coarser rules are not in the asymptotic regime; finer cost r^d
EIG_TOL = 1e-12


# ----------------------------------------------------------------------------- columns
@dataclass(frozen=True)
class Column:
    """One token column type: weight (probability of the θ atom), mean and covariance."""

    weight: float
    mean: np.ndarray
    cov: np.ndarray


class Overlaps(Protocol):
    """What :func:`signal_columns` reads of a state: M (H × F), Q (H × H) and H (a
    :class:`State`, or the one-column stand-in of ``precise``)."""

    @property
    def M(self) -> np.ndarray: ...

    @property
    def Q(self) -> np.ndarray: ...

    @property
    def H(self) -> int: ...


def signal_columns(task: Task, state: Overlaps) -> list[Column]:
    """Signal-token columns: one per atom for a discrete prior, one folded Gaussian otherwise."""
    prior = task.prior
    if isinstance(prior, GaussianPrior):
        cov = state.Q + state.M @ np.diag(prior.nu) @ state.M.T
        return [Column(1.0, np.zeros(state.H), cov)]
    if not prior.is_discrete:
        raise ValidationError(f"prior: quadrature needs a discrete or Gaussian prior "
                              f"(got '{prior.name}')")
    atoms, pi = prior.atoms()
    return [Column(float(p), state.M @ th, state.Q) for th, p in zip(atoms, pi) if p > 0]


def whiten(cov: np.ndarray) -> np.ndarray:
    """A with cov = A Aᵀ over the range of cov only (H × rank), from its eigendecomposition."""
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    keep = vals > EIG_TOL * max(1.0, float(np.max(np.abs(vals), initial=0.0)))
    return vecs[:, keep] * np.sqrt(vals[keep])


# ----------------------------------------------------------------------------- 1-D rules
def trapezoid_normal(sigma: float, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights for E f(z), z ~ N(0,1), by the trapezoid rule (step ∝ 1/σ).

    The node count (≈ 57 σ level) is checked against the memory limit before the nodes are
    made: a huge σ (overlaps or signal strengths near 1e300) would otherwise allocate
    without bound."""
    if sigma <= 0:
        return np.zeros(1), np.ones(1)
    h = min(H_Z_MAX, H_Z / (level * sigma))
    half = np.ceil(Z_RANGE / h)                  # a float: it may be beyond any integer
    check_memory(16.0 * (2 * half + 1), f"a quadrature rule of {2 * half + 1:.3g} nodes (a "
                 f"Gaussian of scale {sigma:.3g})", "use smaller overlaps or signal strengths "
                 "(nu), or --method mc")
    k = int(half)
    z = h * np.arange(-k, k + 1)
    w = h * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    return z, w / w.sum()


def piecewise_gauss_legendre_normal(cuts: np.ndarray, level: float
                                    ) -> tuple[np.ndarray, np.ndarray]:
    """E f(z), z ~ N(0,1), for f smooth between ``cuts`` (shape (..., K)); nodes (..., n).

    Composite Gauss–Legendre on [−10, 10] with the cuts as extra panel edges."""
    order = max(4, int(round(GL_ORDER * level)))
    x, wx = np.polynomial.legendre.leggauss(order)
    cuts = np.clip(np.nan_to_num(cuts, nan=Z_RANGE_GL), -Z_RANGE_GL, Z_RANGE_GL)
    ends = np.full(cuts.shape[:-1] + (1,), Z_RANGE_GL)
    edges = np.sort(np.concatenate([-ends, cuts, ends], axis=-1), axis=-1)
    lo, hi = edges[..., :-1, None], edges[..., 1:, None]
    frac = np.arange(GL_PANELS + 1) / GL_PANELS
    pe = lo + (hi - lo) * frac                               # (..., K+1, P+1)
    a, b = pe[..., :-1, None], pe[..., 1:, None]             # (..., K+1, P, 1)
    z = 0.5 * (a + b) + 0.5 * (b - a) * x
    w = 0.5 * (b - a) * wx * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    shape = cuts.shape[:-1] + (-1,)
    return z.reshape(shape), w.reshape(shape)


@lru_cache(maxsize=64)
def _kinks_of(phi: sp.Expr) -> tuple[float, ...]:
    pts: list[float] = []
    args = [f.args[0] for f in phi.atoms(sp.Heaviside, sp.Abs, sp.sign)]
    for f in phi.atoms(sp.Max, sp.Min):
        args += [p - q for i, p in enumerate(f.args) for q in f.args[i + 1:]]
    for pw in phi.atoms(sp.Piecewise):
        args += [c.lhs - c.rhs for _, c in pw.args if isinstance(c, sp.core.relational.Relational)]
    for arg in args:
        try:
            sol = sp.solveset(arg, S_SYMBOL, sp.S.Reals)
        except (NotImplementedError, ValueError, TypeError):
            continue
        if isinstance(sol, sp.FiniteSet):
            pts += [float(v) for v in sol]
    return tuple(sorted(set(pts)))


def kinks(act: Activation) -> np.ndarray:
    """Points s where φ is not smooth (from Max/Min/Abs/Heaviside/Piecewise in φ)."""
    return np.array(_kinks_of(act.phi), dtype=float)


# ----------------------------------------------------------------------------- helpers
def log_phi(act: Activation, t: np.ndarray) -> np.ndarray:
    """ψ = log φ(t) (−inf where φ = 0), computed without overflow for φ = exp(ψ)."""
    if act.log_psi is not None:
        return act.psi_numpy(t)
    phi = act.phi_numpy(t)
    if np.any(phi < 0):
        raise ValidationError(f"activation '{act.name}': a normalised activation needs phi >= 0")
    with np.errstate(divide="ignore"):
        return np.log(phi)


def exp_minus_exp(x: np.ndarray, k: int) -> np.ndarray:
    """e^{k x − e^x} for k = 0, 1, 2 without overflow (0 where x = ±inf as appropriate)."""
    with np.errstate(over="ignore", invalid="ignore"):
        ex = np.exp(x)
        out = np.exp(k * x - ex) if k else np.exp(-ex)
    return np.nan_to_num(out, nan=0.0)


@dataclass(frozen=True)
class UGrid:
    """Trapezoid grid in u = log t with the e^{−κt} factor folded into the weights."""

    u: np.ndarray
    w: np.ndarray


def largest_psi(psi_max: float, kappa: float) -> float:
    """max(ψ_max, log κ): N = κ + Σ_l φ_l holds κ as one more token of ψ = log κ (κ > 0)."""
    return max(psi_max, math.log(kappa)) if kappa > 0 else psi_max


def u_grid(psi_min: float, psi_max: float, kappa: float, level: float,
           low_margin: float = U_LOW_MARGIN, step: float = H_U,
           max_span: float = 200.0) -> UGrid:
    """u on [−max(ψ_max, log κ) − low_margin, −ψ_min + 4.5] with step ``step``/level
    (default 32, 0.25).

    ψ_min is raised to ψ_max − ``max_span`` (φ → 0 polynomially: beyond it all tokens ≈ 0);
    :class:`QuadEngine` passes a wider span and checks the total mass instead.  κ > 0 counts
    in the low end as a token of ψ = log κ: the κ term of the mass, ∫ κ t e^{−κt} du, has the
    tail κ e^{u_lo} however silent the heads are."""
    psi_min = max(psi_min, psi_max - max_span)
    h = step / level
    lo, hi = -largest_psi(psi_max, kappa) - low_margin, -psi_min + U_HIGH_MARGIN
    u = lo + h * np.arange(int(np.ceil((hi - lo) / h)) + 1)
    with np.errstate(over="ignore"):
        damp = np.exp(-kappa * np.exp(u)) if kappa > 0 else np.ones_like(u)
    return UGrid(u, h * damp)


def tensor_rules(A: np.ndarray, level: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 1-D trapezoid rules of the tensor grid for E f(A z): one per column of A."""
    return [trapezoid_normal(float(np.max(np.abs(A[:, k]))), level) for k in range(A.shape[1])]


def tensor_cost(rules: list[tuple[np.ndarray, np.ndarray]], cost_per_node: float) -> float:
    """Node count of the tensor grid times the cost of one node (compared with MAX_GRID).
    The count is a Python integer product: numpy's int64 product wrapped round at 8 heads
    (e.g. 300^8 ≈ 6.6e19), read as a small grid, and the tensor grid's construction failed
    with "broadcast dimensions too large" (B-softmax, F = 4, ν = 10, H = 8, Fig. 4)."""
    return float(math.prod(len(z) for z, _ in rules)) * cost_per_node


def gaussian_nodes(A: np.ndarray, level: float, cost_per_node: float,
                   replicate: int | None) -> tuple[np.ndarray, np.ndarray, bool]:
    """Nodes y = A z (G × rows of A) and weights for E f(A z), z ~ N(0, I_r).

    Tensor trapezoid (step ∝ 1/max loading of each direction) unless G × cost_per_node
    exceeds ``MAX_GRID``; then scrambled Sobol points (replicate = seed).  Returns
    (y, w, used_rqmc)."""
    r = A.shape[1]
    if r == 0:
        return np.zeros((1, A.shape[0])), np.ones(1), False
    rules = tensor_rules(A, level)
    if tensor_cost(rules, cost_per_node) > MAX_GRID:
        from scipy.stats import qmc  # here: scipy.stats costs ~1 CPU s to import, on this path only
        seed = 0 if replicate is None else replicate
        pts = qmc.Sobol(d=r, scramble=True, seed=np.random.default_rng([seed, r])
                        ).random_base2(RQMC_POINTS_LOG2)
        z = special.ndtri(np.clip(pts, 1e-300, 1 - 1e-16))
        return z @ A.T, np.full(len(z), 1.0 / len(z)), True
    z = np.stack([g.ravel() for g in np.meshgrid(*[z for z, _ in rules], indexing="ij")], axis=1)
    w = np.prod(np.stack([g.ravel() for g in np.meshgrid(*[w for _, w in rules], indexing="ij")],
                         axis=1), axis=1)
    return z @ A.T, w, False


def column_functions(psi: np.ndarray, w: np.ndarray, a: np.ndarray,
                     ug: UGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(B, A, C, A₁)(u) of the module docstring for one column, from ψ = log φ at the nodes
    (G × heads) with node weights w (G,) and output weights a (heads,); A₁ is A with all
    a_h = 1, which gives the total mass E[Σ_{hl} W_hl] (= 1 when κ = 0) as a check."""
    out = np.zeros((4, len(ug.u)))
    chunk = max(1, int(2e6 // max(1, psi.size)))
    for i in range(0, len(ug.u), chunk):
        x = ug.u[i:i + chunk, None, None] + psi[None]               # (U, G, h)
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.sum(np.exp(x), axis=-1)                      # tΦ, may be inf
            half = np.nan_to_num(np.exp(x - 0.5 * total[..., None]), nan=0.0)  # ≤ 2/e
            root = np.exp(-0.5 * total)
        lin = half @ a                                              # Σ_h a_h e^{x_h − tΦ/2}
        out[0, i:i + chunk] = (root * root) @ w
        out[1, i:i + chunk] = (lin * root) @ w
        out[2, i:i + chunk] = (lin * lin) @ w
        out[3, i:i + chunk] = (half.sum(axis=-1) * root) @ w
    return out[0], out[1], out[2], out[3]


def combine(L: int, ug: UGrid, sig: tuple, noise: tuple) -> tuple[float, float, float]:
    """(E[w_0], E[Σ_l w_l²], E[Σ_{hl} W_hl]) from the column functions (B, A, C, A₁) of
    signal and noise (the last is 1 − E[κ/N]: exactly 1 when κ = 0)."""
    B_s, A_s, C_s, M_s = sig
    B_n, _, C_n, M_n = noise
    w0 = np.sum(ug.w * A_s * B_n ** (L - 1))
    w2 = np.sum(ug.w * (C_s * B_n ** (L - 1) + (L - 1) * C_n * B_s * B_n ** (L - 2)))
    mass = np.sum(ug.w * (M_s * B_n ** (L - 1) + (L - 1) * M_n * B_s * B_n ** (L - 2)))
    return float(w0), float(w2), float(mass)


# ----------------------------------------------------------------------------- engine
class QuadEngine:
    """Evaluates E at one resolution ``level`` (RQMC replicate ``replicate`` when needed)."""

    def __init__(self, task: Task, act: Activation, state: State, level: float = 1.0,
                 replicate: int | None = None) -> None:
        self.task, self.act, self.state, self.level = task, act, state, level
        self.c = np.asarray(state.b, dtype=float) + act.offsets(np.diag(state.Q))
        self.a = np.asarray(state.a, dtype=float)
        self.signals = signal_columns(task, state)
        self.noise = Column(1.0, np.zeros(state.H), state.Q)
        self.replicate = replicate
        self.used_rqmc = False
        # the largest |E[Σ W] − 1| seen (κ = 0): a failed u or z range shows here
        self.mass_defect = 0.0

    # -- assembly -----------------------------------------------------------------
    def error(self) -> float:
        """Δ + Σ_j π_j (1 − 2 E_j[w_0] + E_j[Σ_l w_l²])."""
        w0, w2 = self.moments()
        return self.task.delta + 1.0 - 2.0 * w0 + w2

    def moments(self) -> tuple[float, float]:
        """(E[w_0], E[Σ_l w_l²]) averaged over θ."""
        norm = self.act.norm
        if norm == "elementwise":
            return self._elementwise()
        if norm == "joint":
            return self._joint()
        return self._per_head()

    # -- u range ------------------------------------------------------------------
    def _psi_range(self, heads: list[int]) -> tuple[float, float]:
        zs = np.linspace(-Z_RANGE, Z_RANGE, 161)
        lo, hi = np.inf, -np.inf
        for col in self.signals + [self.noise]:
            for h in heads:
                s = col.mean[h] + np.sqrt(max(col.cov[h, h], 0.0)) * zs + self.c[h]
                psi = log_phi(self.act, s)
                fin = psi[np.isfinite(psi)]
                if fin.size:
                    lo, hi = min(lo, fin.min()), max(hi, fin.max())
        if not np.isfinite(hi):
            raise ValidationError(f"activation '{self.act.name}': phi vanishes on the whole "
                                  "score range, so the normaliser is zero")
        return lo, hi

    def _ugrid(self, heads: list[int]) -> UGrid:
        return u_grid(*self._psi_range(heads), self.act.kappa, self.level, max_span=MAX_PSI_SPAN)

    def fits_tensor(self) -> bool:
        """Whether every Gaussian column fits a tensor grid at this level (no RQMC), checked
        from the grid sizes before any evaluation (the same test as ``gaussian_nodes``)."""
        if self.act.norm == "elementwise":
            return True
        groups = [list(range(self.state.H))] if self.act.norm == "joint" else \
            [[h] for h in range(self.state.H)]
        for heads in groups:
            cost = len(self._ugrid(heads).u) * len(heads)
            for col in self.signals + [self.noise]:
                A = whiten(col.cov[np.ix_(heads, heads)])
                if A.shape[1] and tensor_cost(tensor_rules(A, self.level), cost) > MAX_GRID:
                    return False
        return True

    # -- joint: one t, H-dim Gaussian column ---------------------------------------
    def _column_nodes(self, col: Column, heads: list[int], n_u: int
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Scores s (G × |heads|) and weights (G,) for E over one column (tensor or RQMC)."""
        mean = col.mean[heads]
        z, w, rqmc = gaussian_nodes(whiten(col.cov[np.ix_(heads, heads)]), self.level,
                                    n_u * len(heads), self.replicate)
        self.used_rqmc |= rqmc
        return mean + z, w

    def _column_functions(self, s: np.ndarray, w: np.ndarray, heads: list[int], ug: UGrid,
                          a: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return column_functions(log_phi(self.act, s + self.c[heads]), w, a, ug)

    def _joint_like(self, heads: list[int], a: np.ndarray) -> tuple[float, float]:
        """(E[w_0], E[Σ_l w_l²]) for the heads ``heads`` jointly normalised, weights a."""
        ug = self._ugrid(heads)
        s_n, w_n = self._column_nodes(self.noise, heads, len(ug.u))
        noise = self._column_functions(s_n, w_n, heads, ug, a)
        w0 = w2 = mass = 0.0
        for col in self.signals:
            s_s, w_s = self._column_nodes(col, heads, len(ug.u))
            a0, a2, m = combine(self.task.L, ug, self._column_functions(s_s, w_s, heads, ug, a),
                                noise)
            w0 += col.weight * a0
            w2 += col.weight * a2
            mass += col.weight * m
        self._check_mass(mass)
        return w0, w2

    def _check_mass(self, mass: float) -> None:
        if self.act.kappa == 0:
            self.mass_defect = max(self.mass_defect, abs(mass - 1.0))

    def _joint(self) -> tuple[float, float]:
        return self._joint_like(list(range(self.state.H)), self.a)

    # -- per head -------------------------------------------------------------------
    def _per_head(self) -> tuple[float, float]:
        H = self.state.H
        w0 = w2 = 0.0
        a = self.a
        # one u grid per head: the heads' ψ ranges may be far apart (large b_h)
        grids = [self._ugrid([h]) for h in range(H)] if H > 1 else []
        self._precheck_pairs(grids)
        for h in range(H):  # one head alone is a joint normalisation with a = 1
            e0, e2 = self._joint_like([h], np.ones(1))
            w0 += a[h] * e0
            w2 += a[h] ** 2 * e2
        if H > 1:
            for h in range(H):
                for g in range(h + 1, H):
                    w2 += 2 * a[h] * a[g] * self._cross(h, g, grids[h], grids[g])
        return w0, w2

    def _pair_tables(self, col: Column, h: int, g: int, ug_h: UGrid,
                     ug_g: UGrid) -> tuple[np.ndarray, np.ndarray]:
        """(B2, D)(u, u') for heads (h, g) on one column, by nested conditioning; u on
        head h's grid, u' on head g's."""
        swap, first, second, s1, beta, sc = self._pair_geometry(col, h, g)
        u1, u2 = (ug_g.u, ug_h.u) if swap else (ug_h.u, ug_g.u)
        z1, w1 = trapezoid_normal(s1, self.level)
        z2, w2 = trapezoid_normal(sc, self.level)
        self._check_pair_memory(len(u2), len(z1), len(z2), h, g, max(s1, sc))
        psi1 = log_phi(self.act, col.mean[first] + s1 * z1 + self.c[first])         # (n1,)
        psi2 = log_phi(self.act, col.mean[second] + beta * z1[:, None] + sc * z2[None, :]
                       + self.c[second])                                           # (n1, n2)
        x1 = u1[:, None] + psi1[None]
        x2 = u2[:, None, None] + psi2[None]
        GB = exp_minus_exp(x2, 0) @ w2                                            # (U', n1)
        GD = exp_minus_exp(x2, 1) @ w2
        B2 = (exp_minus_exp(x1, 0) * w1) @ GB.T
        D = (exp_minus_exp(x1, 1) * w1) @ GD.T
        return (B2.T, D.T) if swap else (B2, D)

    @staticmethod
    def _pair_geometry(col: Column, h: int, g: int) -> tuple[bool, int, int, float, float, float]:
        """(swap, first, second, σ₁, β, σ_c): s_first = μ + σ₁ z₁, s_second = μ' + β z₁ + σ_c z₂,
        the wider head first."""
        q = col.cov[np.ix_([h, g], [h, g])]
        swap = bool(q[1, 1] > q[0, 0])
        first, second = (g, h) if swap else (h, g)
        q11, q12, q22 = col.cov[first, first], col.cov[first, second], col.cov[second, second]
        s1 = float(np.sqrt(max(q11, 0.0)))
        beta = q12 / s1 if s1 > 0 else 0.0
        sc = float(np.sqrt(max(q22 - beta * beta, 0.0)))
        if sc < np.sqrt(EIG_TOL) * max(1.0, np.sqrt(max(q22, 0.0))):
            sc = 0.0
        return swap, first, second, s1, beta, sc

    @staticmethod
    def _check_pair_memory(n_u: int, n1: int, n2: int, h: int, g: int, spread: float) -> None:
        # the pair tables hold U' × n1 × n2 values (three such arrays at once)
        check_memory(24.0 * n_u * n1 * n2, f"quadrature of the head pair ({h}, {g}) with "
                     f"score spread {spread:.3g}", "use --method mc for such large overlaps")

    def _precheck_pairs(self, grids: list[UGrid]) -> None:
        """Refuse before any work when a pair table would not fit (see _pair_tables)."""
        for col in self.signals + [self.noise]:
            for h in range(self.state.H):
                for g in range(h + 1, self.state.H):
                    swap, _, _, s1, _, sc = self._pair_geometry(col, h, g)
                    n_u = len(grids[h if swap else g].u)
                    n1, n2 = (len(trapezoid_normal(s, self.level)[0]) for s in (s1, sc))
                    self._check_pair_memory(n_u, n1, n2, h, g, max(s1, sc))

    def _cross(self, h: int, g: int, ug_h: UGrid, ug_g: UGrid) -> float:
        """E[Σ_l W_hl W_gl] for per-head normalisation (two t variables)."""
        L = self.task.L
        Bn, Dn = self._pair_tables(self.noise, h, g, ug_h, ug_g)
        W = np.outer(ug_h.w, ug_g.w)
        total = 0.0
        for col in self.signals:
            Bs, Ds = self._pair_tables(col, h, g, ug_h, ug_g)
            val = Ds * Bn ** (L - 1) + (L - 1) * Dn * Bs * Bn ** (L - 2)
            total += col.weight * float(np.sum(W * val))
        return total

    # -- elementwise ------------------------------------------------------------------
    def _phi_pair_mean(self, col: Column, h: int, g: int) -> float:
        """E[φ(t_h) φ(t_g)] by nested composite Gauss–Legendre split at the kinks of φ."""
        q = col.cov[np.ix_([h, g], [h, g])]
        first, second = (g, h) if q[1, 1] > q[0, 0] else (h, g)
        q11, q12, q22 = col.cov[first, first], col.cov[first, second], col.cov[second, second]
        s1 = np.sqrt(max(q11, 0.0))
        beta = q12 / s1 if s1 > 0 else 0.0
        sc = np.sqrt(max(q22 - beta * beta, 0.0))
        m1, m2 = col.mean[first] + self.c[first], col.mean[second] + self.c[second]
        k = kinks(self.act)
        z1, w1 = self._gl_nodes(k, m1, s1, np.zeros(()))
        base2 = m2 + beta * z1                                                     # (n1,)
        z2, w2 = self._gl_nodes(k, base2, sc, base2)                              # (n1, n2)
        f1 = self.act.phi_numpy(m1 + s1 * z1)
        f2 = self.act.phi_numpy(base2[:, None] + sc * z2)
        return float(np.sum(w1 * f1 * np.sum(w2 * f2, axis=-1)))

    def _gl_nodes(self, k: np.ndarray, base: object, sigma: float,
                  shape_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if sigma <= 0:
            ones = np.ones(np.shape(shape_of) + (1,))
            return 0.0 * ones, ones
        cuts = (k - np.asarray(base)[..., None]) / sigma if k.size else np.full(
            np.shape(shape_of) + (0,), np.nan)
        return piecewise_gauss_legendre_normal(cuts, self.level)

    def _phi_mean(self, col: Column, h: int) -> float:
        s1 = np.sqrt(max(col.cov[h, h], 0.0))
        m1 = col.mean[h] + self.c[h]
        z, w = self._gl_nodes(kinks(self.act), m1, s1, np.zeros(()))
        return float(np.sum(w * self.act.phi_numpy(m1 + s1 * z)))

    def _elementwise(self) -> tuple[float, float]:
        H, L, a = self.state.H, self.task.L, self.a

        def square_mean(col: Column) -> float:
            return sum((1 if h == g else 2) * a[h] * a[g] * self._phi_pair_mean(col, h, g)
                       for h in range(H) for g in range(h, H))

        noise2 = square_mean(self.noise)
        w0 = w2 = 0.0
        for col in self.signals:
            w0 += col.weight * sum(a[h] * self._phi_mean(col, h) for h in range(H))
            w2 += col.weight * (square_mean(col) + (L - 1) * noise2)
        return w0, w2


# ----------------------------------------------------------------------------- driver
@dataclass(frozen=True)
class QuadResult:
    """Value, error estimate and how it was obtained."""

    value: float
    abs_err: float
    rule: str
    w0: float
    w2: float
    level: float = 1.0     # the resolution of the rule used (see quad_moments)


def tensor_level(task: Task, act: Activation, state: State, resolution: float) -> float:
    """The resolution to use: ``resolution`` itself, or the finest of resolution·0.75^k
    (k ≥ 1, down to the lowest allowed) whose tensor grid fits, if the requested one needs
    RQMC.  A converged tensor rule beats RQMC: on B-softmax, H = 2, L = 5, ν = (8, 8) the
    replicates' values are skewed (median 2.5e-4 below the mean, rare values 3e-3 above), so a
    few replicates sit low together with a small spread (8 × 2^12 points: 1.6e-4 low, spread
    3.3e-5), where the tensor rule at resolution 1 agrees with laplace to 1e-14."""
    level = resolution
    while level >= RESOLUTION_RANGE[0]:
        if QuadEngine(task, act, state, level).fits_tensor():
            return level
        level *= COARSE
    return resolution


def needs_rqmc(task: Task, act: Activation, state: State, resolution: float = 1.0) -> bool:
    """Whether :func:`quad_moments` at ``resolution`` would fall to RQMC: no tensor grid fits
    at any allowed level (:func:`tensor_level`), decided from the grid sizes alone."""
    level = tensor_level(task, act, state, check_resolution(resolution))
    return not QuadEngine(task, act, state, level).fits_tensor()


def quad_moments(task: Task, act: Activation, state: State,
                 resolution: float = 1.0) -> QuadResult:
    """E, with abs_err from two resolutions (tensor rules) or the RQMC replicate spread.

    A requested resolution whose tensor grid does not fit is lowered to the finest that
    does (:func:`tensor_level`; ``level`` in the result); RQMC only when none does.
    ``w0`` = E[w_ε] and ``w2`` = E[Σ_l w_l²] at the finer resolution (or RQMC mean)."""
    resolution = tensor_level(task, act, state, check_resolution(resolution))
    fine = QuadEngine(task, act, state, resolution)
    f0, f2 = fine.moments()
    if fine.used_rqmc:
        engines = [QuadEngine(task, act, state, resolution, replicate=i)
                   for i in range(1, RQMC_REPLICATES)]
        arr = np.array([(f0, f2)] + [e.moments() for e in engines])
        vals = task.delta + 1 - 2 * arr[:, 0] + arr[:, 1]
        err = float(vals.std(ddof=1) / np.sqrt(len(vals)))
        defect = max([fine.mass_defect] + [e.mass_defect for e in engines])
        m0, m2 = arr.mean(axis=0)
        return QuadResult(float(vals.mean()), honest_error(err, defect), "rqmc", float(m0),
                          float(m2), resolution)
    coarse_engine = QuadEngine(task, act, state, COARSE * resolution)
    c0, c2 = coarse_engine.moments()
    value = task.delta + 1 - 2 * f0 + f2
    coarse = task.delta + 1 - 2 * c0 + c2
    err = max(abs(value - coarse), 4 * np.finfo(float).eps * max(1.0, abs(value)))
    err = honest_error(err, max(fine.mass_defect, coarse_engine.mass_defect))
    return QuadResult(value, err, "trapezoid" if act.norm != "elementwise" else "gauss-legendre",
                      f0, f2, resolution)


def check_resolution(resolution: object) -> float:
    """The quadrature resolution r: a number in :data:`RESOLUTION_RANGE` (a coarser rule is
    outside the asymptotic regime where two resolutions bound the error; a finer one costs
    r^d without a gain in float64)."""
    lo, hi = RESOLUTION_RANGE
    if isinstance(resolution, bool) or not isinstance(resolution, (int, float, np.floating,
                                                                    np.integer)):
        raise ValidationError(f"resolution: must be a number in [{lo:g}, {hi:g}] "
                              f"(got {resolution!r})")
    r = float(resolution)
    if not (lo <= r <= hi):
        raise ValidationError(f"resolution: must be a number in [{lo:g}, {hi:g}] (got {r!r})")
    return r


def honest_error(err: float, mass_defect: float) -> float:
    """abs_err no smaller than the failure of the built-in check E[Σ_{hl} W_hl] = 1 (κ = 0):
    weights that do not sum to one mean the u or z range missed part of the integral, and
    E = 1 − 2 E[w_0] + E[Σ w²] is then off by up to a few times that defect."""
    return max(err, 4.0 * mass_defect)


# ----------------------------------------------------------------------------- Bayes error
def bayes_setup(task: Task) -> tuple[Activation, State]:
    """The B-softmax whose weights are the Bayes posterior p_l of a discrete prior.

    Heads at the atoms: k_j = U θ^(j), so M = Θ (K × F), Q = Θ Θᵀ (rank ≤ F), a_j = 1, b = 0
    and offsets −|θ^(j)|²/2 + log π_j.  Atoms of zero weight are dropped."""
    atoms, pi = task.prior.atoms()
    keep = pi > 0
    atoms, pi = atoms[keep], pi[keep]
    act = Activation("bayes-posterior", sp.exp(S_SYMBOL), "joint", 0.0, offset="bayes",
                     a_rule="1", log_pi=tuple(float(x) for x in np.log(pi)))
    K = len(pi)
    return act, State(atoms, atoms @ atoms.T, np.ones(K), np.zeros(K))


def _bayes_gaussian_moments(task: Task, level: float,
                            replicate: int | None) -> tuple[tuple[float, float], bool]:
    """(E[p_0], E[Σ p_l²]) for the Gaussian prior: one 'head' with ψ(p) = Σ_f β_f p_f²,
    β_f = ν_f / (2(1 + ν_f)), columns p ~ N(0, I + diag ν) (signal) and N(0, I) (noise).

    The trapezoid step in each p_f is set by the slope of ψ (2 β σ² · 3) as well as σ,
    because e^{−t e^{βp²}} is not analytic in a uniform strip."""
    nu = cast(GaussianPrior, task.prior).nu        # the Gaussian prior's moments
    beta = nu / (2 * (1 + nu))
    psi_max = float(np.sum(beta * (1 + nu))) * Z_RANGE ** 2
    check_bayes_span(nu, psi_max)
    # the whole ψ range: every token's ψ is drawn from the same χ²-like law, so a span cut
    # below ψ_max (u_grid's default 200, meant for tokens that vanish next to the largest)
    # dropped the typical tokens: E_Bayes came out 0.98 instead of 0.44 at ν = (3, 3), L = 4
    ug = u_grid(0.0, psi_max, 0.0, level, max_span=MAX_PSI_SPAN)
    funcs, rqmc = [], False
    for var in (1 + nu, np.ones_like(nu)):
        sigma = np.sqrt(var)
        eff = np.maximum(sigma, 6 * beta * var)
        y, w, used = gaussian_nodes(np.diag(eff), level, len(ug.u), replicate)
        rqmc |= used
        psi = np.sum(beta * (y * sigma / eff) ** 2, axis=1)[:, None]
        funcs.append(column_functions(psi, w, np.ones(1), ug))
    w0, w2, _ = combine(task.L, ug, funcs[0], funcs[1])
    return (w0, w2), rqmc


def check_bayes_span(nu: np.ndarray, psi_max: float) -> None:
    """Refuse, before any node is built, a Gaussian prior whose ψ range (ψ_max = Z² Σ ν_f / 2)
    is wider than the u grid covers (:data:`MAX_PSI_SPAN`): the grid's size grows with it
    (ν = 1e308 asked for about 1e154 trapezoid nodes).  A ResourceError, so that ``auto``
    falls back to Monte Carlo."""
    if not psi_max <= MAX_PSI_SPAN:
        most = 2 * MAX_PSI_SPAN / Z_RANGE ** 2
        raise ResourceError(f"resources: the quadrature of the Bayes error covers a Gaussian "
                            f"prior with sum(nu) up to {most:.3g} (got nu = "
                            f"{', '.join(f'{x:.4g}' for x in nu)}: its grid in log t would "
                            f"span psi up to {psi_max:.3g}); use smaller nu or --method mc")


def bayes_moments(task: Task, level: float = 1.0,
                  replicate: int | None = None) -> tuple[tuple[float, float], bool]:
    """((E[p_0], E[Σ_l p_l²]), used_rqmc) at one resolution; equal by the tower property."""
    if isinstance(task.prior, GaussianPrior):
        return _bayes_gaussian_moments(task, level, replicate)
    if not task.prior.is_discrete:
        raise ValidationError(f"prior: the Bayes error needs a discrete or Gaussian prior "
                              f"(got '{task.prior.name}')")
    K = len(task.prior.atoms()[1])
    check_memory(8.0 * K * K * 4, f"the Bayes error by quadrature with {K} prior atoms",
                 "use fewer signal strengths (F) or --method mc")
    act, state = bayes_setup(task)
    eng = QuadEngine(task, act, state, level, replicate)
    return eng.moments(), eng.used_rqmc


def quad_bayes(task: Task, resolution: float = 1.0) -> QuadResult:
    """E_Bayes = Δ + 1 − E[Σ p²]; abs_err covers two resolutions (or the RQMC spread) and
    the tower-property gap |E[p_0] − E[Σ p²]|."""
    (f0, f2), rqmc = bayes_moments(task, resolution)
    if rqmc:
        reps = np.array([(f0, f2)] + [bayes_moments(task, resolution, i)[0]
                                      for i in range(1, RQMC_REPLICATES)])
        f0, f2 = reps.mean(axis=0)
        spread = float(reps[:, 1].std(ddof=1) / np.sqrt(len(reps)))
        rule = "rqmc"
    else:
        (_, c2), _ = bayes_moments(task, COARSE * resolution)
        spread, rule = abs(f2 - c2), "trapezoid"
    err = max(spread, abs(f0 - f2), 4 * np.finfo(float).eps)
    return QuadResult(task.delta + 1 - f2, err, rule, float(f0), float(f2))
