"""Deterministic drift expectations by the Laplace reduction (docs/theory.md §5, "Expectation engines").

The per-sample drift integrands (``integrands.py``, conditional-mean projections) are
polynomials in per-token quantities: W_{hl} = φ(t_{hl})/N, D_{hl} = φ′(t_{hl})/N, the scores
s_{hl}, the projections P_{fl} and the signal indicator δ_{l0}, with t_{hl} = s_{hl} + b_h + o_h.
This module takes their expectation without sampling:

1. **Token sums.**  Each field is written in a small token-sum algebra (:class:`TokenPoly`):
   e_l = δ_{l0} − Σ_h a_h W_{hl};  J_{hl,l′} = D_{hl}(α_h δ_{ll′} − β_{hl′}) with α_h = a_h and
   β_{hl′} = a_h W_{hl′} (per-head), w_{l′} (joint), 0 (elementwise), so that
   g_{hl} = J_{hl}·e = D_{hl}(α_h e_l − Σ_{l′} β_{hl′} e_{l′}) and
   Σ_l J_{hl}·J_{h′l} = Σ_l D_{hl} D_{h′l}(α_h α_{h′} − α_h β_{h′l} − α_{h′} β_{hl} + Σ_{l′} β_{hl′} β_{h′l′}).
   Then dM_{hf} = Σ_l g_{hl} P_{fl}, dQ^lin_{hh′} = Σ_l g_{hl} s_{h′l} (+ transpose),
   dQ^noise_{hh′} = (|e|² + Δ) Σ_l J_{hl}·J_{h′l} + 2 Σ_l g_{hl} g_{h′l}, da_h = Σ_l W_{hl} e_l,
   db_h = Σ_l g_{hl}.  The Bayes-offset terms 2ρ_h m_{hf}, 2ρ_h Q_{hh′} with ρ_h = −½ db_h are
   linear in E[db] and added afterwards.
2. **Distinct-token patterns.**  A product of k token sums is expanded over the set partitions
   of its k indices into sums over *distinct* tokens.  By exchangeability a pattern with n
   blocks on noise tokens has multiplicity (L−1)(L−2)…(L−n); at most one block sits on the
   signal token 0 (δ atoms force it there).
3. **Laplace reduction.**  Every W or D carries one 1/N.  A pattern with k_h of them for
   normaliser h uses N_h^{−k} = ∫_0^∞ t^{k−1} e^{−tN_h} dt / Γ(k); in u = log t each atom gets a
   factor t (tφ = e^{u+ψ}, ψ = log φ), e^{−tN} factorises over tokens (κ gives e^{−κt}), so the
   pattern is a u-integral of a product of one-token tables
   T_μ(u) = E_col[μ̂(s) e^{−Σ_h t_h φ_h(s_h)}] (signal column for one block, noise column for the
   others, T_1 for the L−1−n plain noise tokens).  Per-head activations have one u per active
   head (H ≤ 2: at most a 2-D u grid), joint ones a single u, elementwise ones none.
4. **Projections.**  E[p_{:,l} | s] = Mᵀ Q⁺ (s_{:,l} − δ_{l0} M θ) is linear in the scores, so P is
   a one-token function: P = B s on noise tokens (B = Mᵀ Q⁺), B (s − Mθ) + θ on the signal token
   of a discrete atom, and (I + diag ν) Mᵀ C⁺ s for a Gaussian prior (signal column N(0, C),
   C = Q + M diag ν Mᵀ, by linear Gaussian conditioning of θ and the projections on s_0).
   Signal atoms with the same score mean Mθ share their tables; their θ parts are summed with
   ``math.fsum``, so a flipping prior with m_{:,f} = 0 gives a drift of exactly 0 along f.
5. **Rules.**  u: the trapezoid grid of ``quadrature.u_grid`` over the whole ψ span, with its
   top cut where the ≥ L − 1 − n_max plain noise tokens of every pattern make it < 1e−20
   (``_cut_top``) and 4× wider steps in the lower tail through an analytic change of
   variable (``_stretch_low``); together with flushing subnormal kernel values to 0 this made
   the Fig. 1 drifts 10–15× cheaper at unchanged values (≤ 1.3e−14).  Gaussian columns: trapezoid in
   whitened variables (only the range of the covariance, so singular Q and M = Q = 0 work);
   per-head H = 2 uses nested conditioning s_1 = μ_1 + σ_1 z_1, s_2 = μ_2 + β z_1 + σ_c z_2 so that a
   2-D (u_1, u_2) table is one matrix product over z_1.  Elementwise φ (which may have kinks) uses
   composite Gauss–Legendre with the kinks as panel edges, nested for two heads.

6. **Summation.**  The patterns of one (activation, a, F, L, Δ) are grouped once
   (:class:`PatternPlan`): patterns that share their active set, noise tables and number of
   plain tokens share the product measure × Π T_noise × T_1^{rest}, and each adds one dot
   product with its signal table.  The largest array of a per-head H = 2 evaluation, the inner
   kernel e^{−e^{u+ψ}} over (z_1, u, z_2), is one compiled pass (``_minus_exp_product``).
   Together with a vectorised log-moment bound of the u grid this took a Fig. 1 drift from
   0.146 to 0.10 CPU s (measured at a plateau state, fields unchanged to ≤ 2e−15).  On the
   nested rule the signal groups of a discrete prior are one stacked column
   (``merged_column``), the kernel's e^{−x} is a vectorised polynomial, and every 2-D table is
   C-contiguous in head order: a further 1.3× (fields unchanged to ≤ 7e−16).

7.  **Bounded memory.**  At key norm |k| = max_h √Q_hh every axis (z_1, z_2, u_0, u_1) grows
   like |k|, so the two-head tables (U_0 × U_1 each, ~300 of them) and the inner sums grow like
   |k|²; the inner kernel's exponent split fell back to whole (U, n_1, n_2) kernels beyond
   |k| ≈ 8.5 (9.7 GB asked for at |k| = 10).  Now the split runs on u segments with their own
   offset (``_batch_inner``), and an evaluation whose estimate exceeds
   ``resources.engine_memory_budget()`` (a quarter of --max-memory, at most 1 GiB) is summed
   over windows of one head's u grid (``_Engine.bounded``); a state whose nodes alone exceed
   the budget (|k| ≳ 30 at the default budget) raises ``ResourceError`` naming its key norm.

``abs_err`` of every field is the difference to the same computation at the next coarser
resolution (× ``COARSE``, as ``quadrature.quad_moments`` does), on a ladder chosen per state:
the first rung whose largest abs_err is below ``tol`` (1e−8) is returned
(:meth:`LaplaceDrift.evaluate`; along Fig. 1 the cheapest rung, 0.75 against 0.5625, took a
drift from ~0.26 to ~0.13 CPU s).  E alone has its own 9 patterns (``evaluate_error``, ~1/3 of
a drift), which the ODE uses at its dense-output records.  Inside
:meth:`LaplaceDrift.per_step_check` (the adaptive ODE path) the ladder runs once per step, at
its first drift; the step's later calls take that rung alone and its abs_err (a Fig. 1 curve
1.46–1.52× less CPU, the same numbers).  The route (token patterns + Laplace
reduction + nested tables) was chosen because it reuses the one-token machinery of the error
engine, gives every field from one set of tables, and costs nothing in L.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

import numba
import numpy as np
import sympy as sp
from scipy import special

from ..model.activations import S_SYMBOL, Activation, lambdify_numpy
from ..kernels.integrands import projection_matrix
from ..io import limits as resources
from ..model.priors import GaussianPrior
from ..model.validation import ResourceError, ValidationError
from ..model.task import Task
from . import montecarlo as mc
from .drift import DriftMeans
from .quadrature import COARSE, EIG_TOL, MAX_PSI_SPAN, UGrid, exp_minus_exp, gaussian_nodes, kinks, largest_psi, log_phi, piecewise_gauss_legendre_normal, tensor_cost, tensor_rules, trapezoid_normal, u_grid, whiten

Mono = tuple[str, ...]           # sorted atom names at one token, e.g. ("D0", "P1", "W0")
MAX_H = {"elementwise": 2, "per-head": 2, "joint": 3}
MAX_L = 64
DEFAULT_LEVEL = 1.0
DEFAULT_TOL = 1e-8               # accept a rung of the resolution ladder when abs_err < tol
LADDER_RUNGS = 3                 # fine runs at level × COARSE, level, level / COARSE at most
# Resolution at level 1.  Measured on softmax H = 2, L = 10: the error at level 0.75 is
# ~1e−13–2e−11, but it grows erratically to ~1e−7 when the steps are a further 1.33× coarser
# (factors (tφ)^k with k up to 6 narrow the strip of analyticity; along Fig. 1 level 0.5625 is
# off by 2e−10–5e−9), so the ladder's first rung (0.75 against 0.5625) is kept only where
# that measured difference is < tol, and no rung is coarser.
U_STEP = 0.3                     # trapezoid step in u = log t
U_LOW = 32.0                     # lower u margin: the cut tail is ≤ e^{−32} ≈ 1e−14
Z_LEVEL = 1.25                   # whitened-score step 0.24/σ (``trapezoid_normal``)
GL_LEVEL = 1.6                   # Gauss–Legendre order 16 per panel (elementwise fields reach O(10–100))
JOINT3_Z = 0.64                  # joint H = 3: 3-D grid, step 0.375/σ (coarse-run error ~5e−10, measured)
INNER_BLOCK = 2 ** 16           # kernel entries (z_1 rows × U × z_2) per block of ``_batch_inner``
WEIGHT_BLOCK = 2 ** 21           # weight entries (z_1 rows × z_2 × keys) per block of ``_batch_inner``
FLAT_CHUNK = 4e6                 # kernel entries (u points × nodes) per chunk of the joint rule
X_CLIP = 6.6                     # e^{−e^{6.6}} underflows: tφ beyond this contributes nothing
LOG_PATTERN_BOUND = 80.0         # log of a bound on a pattern's factors other than plain tokens
STRETCH = 3.0                    # lower u tail: steps 1 + STRETCH times wider (``_stretch_low``)
STRETCH_GAP = 6.0                # ... below u = −ψ_max − STRETCH_GAP, where tφ ≤ e^{−6}
STRETCH_WIDTH = 1.0              # ... with a transition of this width in u
GAUSS_TAIL = 2e-17                # P(|z| > 8.5): the score mass the trapezoid does not see
U_TOP_CUT = 46.0                 # the cut top of the u integral is ≤ e^{−46} ≈ 1e−20 per pattern
REUSE_SPAN = 0.1                 # ``per_step_check``: relative distance to the step's anchor
MIN_WINDOW = 8                   # fewest u points per window of a bounded evaluation
NODE_ARRAYS = 12                 # node-sized arrays one column holds (scores, ψ, ratios, weights)


# ============================================================================ token-sum algebra
class TokenPoly:
    """A polynomial in closed token sums Σ_l μ(l), optionally times a monomial at a free token.

    ``terms`` maps (closed, local) to a coefficient (float or 1-D array): ``closed`` is a sorted
    tuple of monomials, one per closed sum, and ``local`` the monomial at the free index
    (None for an expression without free index)."""

    def __init__(self, terms: dict | None = None, free: bool = True) -> None:
        self.terms: dict = terms or {}
        self.free = free

    @staticmethod
    def atom(name: str) -> "TokenPoly":
        return TokenPoly({((), (name,)): 1.0}, free=True)

    @staticmethod
    def const(c: float, free: bool) -> "TokenPoly":
        return TokenPoly({((), () if free else None): c}, free=free)

    def lifted(self) -> "TokenPoly":
        """The same expression with a free index (a closed c becomes c × 1 at every token)."""
        if self.free:
            return self
        return TokenPoly({(c, ()): v for (c, _), v in self.terms.items()}, free=True)

    def __add__(self, other: "TokenPoly") -> "TokenPoly":
        left, right = (self, other) if self.free == other.free else (self.lifted(), other.lifted())
        out = dict(left.terms)
        for k, v in right.terms.items():
            out[k] = out[k] + v if k in out else v
        return TokenPoly(out, left.free)

    def __sub__(self, other: "TokenPoly") -> "TokenPoly":
        return self + other * (-1.0)

    def __mul__(self, other: "TokenPoly | float") -> "TokenPoly":
        if not isinstance(other, TokenPoly):
            return TokenPoly({k: v * other for k, v in self.terms.items()}, self.free)
        out: dict = {}
        for (c1, l1), v1 in self.terms.items():
            for (c2, l2), v2 in other.terms.items():
                if l1 is None or l2 is None:
                    local = l2 if l1 is None else l1
                else:
                    local = merge(l1, l2)
                key = (tuple(sorted(c1 + c2)), local)
                out[key] = out[key] + v1 * v2 if key in out else v1 * v2
        return TokenPoly(out, self.free or other.free)

    __rmul__ = __mul__

    def tsum(self) -> "TokenPoly":
        """Σ_l over the free index."""
        if not self.free:
            raise TypeError("no free index to sum over")
        out: dict = {}
        for (closed, local), v in self.terms.items():
            key = (tuple(sorted(closed + (local,))), None)
            out[key] = out[key] + v if key in out else v
        return TokenPoly(out, free=False)


def _r_atoms(m: Mono) -> Mono:
    """The θ-part atoms r_f of a merged signal column's monomial (``merged_column``)."""
    return tuple(x for x in m if x[0] == "r")


def merge(m1: Mono, m2: Mono) -> Mono:
    """Product of two monomials at the same token (δ is idempotent)."""
    atoms = m1 + m2
    if atoms.count("d") > 1:
        atoms = tuple(x for x in atoms if x != "d") + ("d",)
    return tuple(sorted(atoms))


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """All set partitions of ``items`` (Bell(k) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def falling(n: int, k: int) -> int:
    """n (n−1) … (n−k+1)."""
    out = 1
    for i in range(k):
        out *= n - i
    return out


# ============================================================================ the integrands
@dataclass(frozen=True)
class Slots:
    """Flat layout of all output fields in one coefficient vector."""

    H: int
    F: int

    @property
    def size(self) -> int:
        return self.H * self.F + 2 * self.H * self.H + 2 * self.H + 1

    def dM(self, h: int, f: int) -> int:
        return h * self.F + f

    def dQ_lin(self, h: int, g: int) -> int:
        return self.H * self.F + h * self.H + g

    def dQ_noise(self, h: int, g: int) -> int:
        return self.H * self.F + self.H ** 2 + h * self.H + g

    def da(self, h: int) -> int:
        return self.H * self.F + 2 * self.H ** 2 + h

    def db(self, h: int) -> int:
        return self.H * self.F + 2 * self.H ** 2 + self.H + h

    def sq(self) -> int:
        return self.size - 1


def drift_polynomial(norm: str, a: np.ndarray, F: int, delta: float) -> TokenPoly:
    """All drift fields as one closed :class:`TokenPoly` with coefficient vectors (``Slots``).

    dQ_lin holds only the half Σ_l g_{hl} s_{h′l}; symmetrisation and the Bayes-offset terms are
    done by the caller."""
    H = len(a)
    slots = Slots(H, F)
    T = TokenPoly.atom
    W = [T(f"W{h}") for h in range(H)]
    D = [T(f"D{h}") for h in range(H)]
    e = T("d")
    for h in range(H):
        e = e - W[h] * float(a[h])
    if norm == "per-head":
        beta = [W[h] * float(a[h]) for h in range(H)]
    elif norm == "joint":
        # one atom w = Σ_h a_h W_h: every W_h shares the one normaliser, and far fewer
        # monomials (hence tables) remain than with the expanded sum
        w = T("w")
        e = T("d") - w
        beta = [w] * H
    else:
        beta = None

    def jv(h: int, v: TokenPoly) -> TokenPoly:
        out = v * float(a[h])
        if beta is not None:
            out = out - (beta[h] * v).tsum()
        return D[h] * out

    def jj_sum(h: int, g: int) -> TokenPoly:
        inner = TokenPoly.const(float(a[h] * a[g]), free=True)
        if beta is not None:
            inner = inner - beta[g] * float(a[h]) - beta[h] * float(a[g])
            inner = inner + (beta[h] * beta[g]).tsum()
        return (D[h] * D[g] * inner).tsum()

    def unit(i: int) -> np.ndarray:
        v = np.zeros(slots.size)
        v[i] = 1.0
        return v

    sq = (e * e).tsum()
    g = [jv(h, e) for h in range(H)]
    total = sq * unit(slots.sq())
    sq_delta = sq + TokenPoly.const(delta, free=False) if delta else sq
    for h in range(H):
        for f in range(F):
            total = total + (g[h] * T(f"P{f}")).tsum() * unit(slots.dM(h, f))
        for k in range(H):
            total = total + (g[h] * T(f"S{k}")).tsum() * unit(slots.dQ_lin(h, k))
        for k in range(h, H):
            noise = sq_delta * jj_sum(h, k) + (g[h] * g[k]).tsum() * 2.0
            total = total + noise * unit(slots.dQ_noise(h, k))
        total = total + (W[h] * e).tsum() * unit(slots.da(h))
        total = total + g[h].tsum() * unit(slots.db(h))
    return total


@dataclass(frozen=True)
class Pattern:
    """One distinct-token pattern: the signal-token monomial (None: a plain token), the sorted
    noise-block monomials, and the summed coefficient vector × multiplicity."""

    signal: Mono | None
    noise: tuple[Mono, ...]


def patterns(poly: TokenPoly, L: int) -> dict[Pattern, np.ndarray]:
    """Expand each product of token sums over distinct-token patterns (see module docstring)."""
    out: dict[Pattern, np.ndarray] = {}

    def add(p: Pattern, c: np.ndarray) -> None:
        out[p] = out[p] + c if p in out else c

    for (closed, _), coef in poly.terms.items():
        for part in set_partitions(list(range(len(closed)))):
            blocks = [_block(closed, b) for b in part]
            n = len(blocks)
            if not any("d" in m for m in blocks):
                mult = falling(L - 1, n)
                if mult:
                    add(Pattern(None, tuple(sorted(blocks))), coef * mult)
            for i, m in enumerate(blocks):
                others = blocks[:i] + blocks[i + 1:]
                if any("d" in o for o in others):
                    continue
                mult = falling(L - 1, n - 1)
                if mult:
                    add(Pattern(tuple(x for x in m if x != "d"), tuple(sorted(others))),
                        coef * mult)
    return out


def _block(closed: tuple[Mono, ...], idx: list[int]) -> Mono:
    m: Mono = ()
    for i in idx:
        m = merge(m, closed[i])
    return m


@lru_cache(maxsize=4096)
def atom_counts(m: Mono, H: int) -> tuple[np.ndarray, np.ndarray]:
    """(k_h, β_h): numbers of W_h or D_h atoms, and of D_h atoms, in a monomial (read-only
    arrays: cached, since every table lookup of a drift asks for them)."""
    k, beta = np.zeros(H, dtype=int), np.zeros(H, dtype=int)
    for x in m:
        if x == "w":                # joint only, where only the total count matters
            k[0] += 1
        elif x[0] in "WD":
            k[int(x[1:])] += 1
            beta[int(x[1:])] += x[0] == "D"
    k.setflags(write=False)
    beta.setflags(write=False)
    return k, beta


# ============================================================================ columns
@dataclass(frozen=True)
class ColumnGroup:
    """Score columns sharing one Gaussian law N(mean, cov) (signal atoms with equal Mθ).

    P = R s + r per atom; ``weight`` = Σ π_j and ``rbar`` = Σ_j π_j r_j (F,) (fsum)."""

    weight: float
    mean: np.ndarray
    cov: np.ndarray
    R: np.ndarray
    rbar: np.ndarray


def column_groups(task: Task, M: np.ndarray, Q: np.ndarray) -> tuple[ColumnGroup, list[ColumnGroup]]:
    """(noise column, signal groups) for the state (M, Q)."""
    H, F = M.shape
    B = projection_matrix(M, Q)
    noise = ColumnGroup(1.0, np.zeros(H), Q, B, np.zeros(F))
    prior = task.prior
    if isinstance(prior, GaussianPrior):
        C = Q + M @ np.diag(prior.nu) @ M.T
        R = np.diag(1.0 + prior.nu) @ M.T @ np.linalg.pinv(C, hermitian=True)
        return noise, [ColumnGroup(1.0, np.zeros(H), C, R, np.zeros(F))]
    atoms, pi = prior.atoms()
    by_mean: dict[tuple, list[int]] = {}
    means = atoms @ M.T
    for j in range(len(pi)):
        if pi[j] > 0:
            by_mean.setdefault(tuple(float(x) for x in means[j]), []).append(j)
    groups = []
    for key, idx in by_mean.items():
        mean = np.array(key)
        r = atoms[idx] - means[idx] @ B.T                      # θ − B M θ per atom
        rbar = np.array([math.fsum(pi[j] * r[i, f] for i, j in enumerate(idx))
                         for f in range(F)])
        groups.append(ColumnGroup(math.fsum(pi[idx]), mean, Q, B, rbar))
    return noise, groups


# ============================================================================ one-token tables
class _NodeColumn:
    """Gaussian (or Gauss–Legendre) nodes of one column and the atom values at them.

    ``s[h]`` are score arrays broadcastable to ``shape``; ``w`` the node weights (``shape``)."""

    def __init__(self, act: Activation, c: np.ndarray, group: ColumnGroup,
                 s: list[np.ndarray], w: np.ndarray) -> None:
        self.act, self.group, self.s, self.w = act, group, s, w
        self.shape = w.shape
        self._cache: dict = {}
        self.t = [x + ch for x, ch in zip(s, c)]
        self.rnode: list[np.ndarray] | None = None    # θ parts per node (``merged_column``)

    def psi(self, h: int) -> np.ndarray:
        key = ("psi", h)
        if key not in self._cache:
            if self.act.log_psi is not None:
                val = self.act.psi_numpy(self.t[h])
            else:
                with np.errstate(divide="ignore"):
                    val = np.log(self.act.phi_numpy(self.t[h]))
            self._cache[key] = val
        return self._cache[key]

    def ratio(self, h: int) -> np.ndarray:
        """φ′/φ at the biased scores."""
        key = ("r1", h)
        if key not in self._cache:
            if self.act.is_plain_exp:
                val = np.ones_like(self.t[h])
            elif self.act.log_psi is not None:
                val = _log_ratio_fn(self.act)(self.t[h])
            else:
                fn = _phi_prime(self.act)
                val = fn(self.t[h]) / self.act.phi_numpy(self.t[h])
            self._cache[key] = val
        return self._cache[key]

    def raw(self, h: int, which: str) -> np.ndarray:
        """φ or φ′ at the biased scores (elementwise activations)."""
        key = ("raw", which, h)
        if key not in self._cache:
            fn = self.act.phi_numpy if which == "W" else _phi_prime(self.act)
            self._cache[key] = fn(self.t[h])
        return self._cache[key]

    def linear(self, m: Mono, rows: slice = slice(None)) -> np.ndarray:
        """Product of the S and P atoms of m at the nodes (P = R s, without the θ part); with
        ``rows``, at those rows of the first axis only (the same values, entry by entry)."""
        out = np.ones(self.shape)[rows]
        s = [x[rows] for x in self.s]
        for x in m:
            if x[0] == "S":
                out = out * s[int(x[1:])]
            elif x[0] == "P":
                row = self.group.R[int(x[1:])]
                out = out * sum(row[h] * s[h] for h in range(len(s)))
            elif x[0] == "r":
                out = out * self.rnode[int(x[1:])][rows]
        return out


def merged_column(cols: list[_NodeColumn], c: np.ndarray) -> _NodeColumn:
    """The signal columns of a discrete prior as one column: their nodes stacked along the
    first axis (z_1 for the nested rule) with the group weights π_c folded into the node
    weights, so that a table Σ_c π_c T_c is one sum over nodes (one batched pass instead of
    one per column, and no sum of tables).  The groups share the covariance Q (hence the
    rules) and the projection R = B; their θ parts r̄_c/π_c become a node-valued atom r_f
    (``linear``) whose group coefficient is 1 where some r̄_{c,f} ≠ 0 and exactly 0 otherwise
    (so a flipping prior with m_{:,f} = 0 still gives exactly 0 along f)."""
    first, groups = cols[0], [col.group for col in cols]
    if any(not np.array_equal(g.R, groups[0].R) for g in groups):
        raise AssertionError("the signal groups of a discrete prior share R = B")
    nested = hasattr(first, "w1")
    s = [np.concatenate([col.s[h] for col in cols]) for h in range(len(first.s))]
    rows = [len(col.w1) if nested else len(col.w) for col in cols]
    F = len(groups[0].rbar)
    rnode = [np.concatenate([np.full(n, col.group.rbar[f] / col.group.weight)
                             for n, col in zip(rows, cols)]) for f in range(F)]
    group = ColumnGroup(1.0, groups[0].mean, groups[0].cov, groups[0].R,
                        np.array([float(any(g.rbar[f] != 0.0 for g in groups)) for f in range(F)]))
    if not nested:
        w = np.concatenate([col.w * col.group.weight for col in cols])
        out = _NodeColumn(first.act, c, group, s, w)
    else:
        if any(not np.array_equal(col.w2, first.w2) for col in cols):
            raise AssertionError("the signal groups of a discrete prior share the z_2 rule")
        w1 = np.concatenate([col.w1 * col.group.weight for col in cols])
        out = _NodeColumn(first.act, c, group, s, np.outer(w1, first.w2))
        out.first, out.w1, out.w2 = first.first, w1, first.w2  # type: ignore[attr-defined]
        rnode = [r[:, None] for r in rnode]
    out.rnode = rnode
    return out


@lru_cache(maxsize=32)
def _phi_prime(act: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """φ′ as a NumPy callable."""
    return lambdify_numpy(act.scalar_derivatives[1])


@lru_cache(maxsize=32)
def _log_ratio_fn(act: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """ψ′ = φ′/φ for φ = e^ψ."""
    return lambdify_numpy(sp.diff(act.log_psi, S_SYMBOL))


def split_p(m: Mono) -> tuple[Mono, int | None]:
    """(m without its P atom, f) — at most one P per monomial (dM is linear in P)."""
    ps = [x for x in m if x[0] == "P"]
    if not ps:
        return m, None
    if len(ps) > 1:
        raise AssertionError("a drift monomial has at most one projection atom")
    i = m.index(ps[0])
    return m[:i] + m[i + 1:], int(ps[0][1:])


def nested_factors(q: np.ndarray) -> tuple[int, int, float, float, float]:
    """(f, g, σ_1, β, σ_c) with s_f = μ_f + σ_1 z_1, s_g = μ_g + β z_1 + σ_c z_2 for a 2×2 covariance,
    f the head of larger variance (so |β| ≤ σ_1 and the z_1 rule resolves both)."""
    first = 0 if q[0, 0] >= q[1, 1] else 1
    second = 1 - first
    s1 = float(np.sqrt(max(q[first, first], 0.0)))
    beta = float(q[first, second] / s1) if s1 > 0 else 0.0
    sc = float(np.sqrt(max(q[second, second] - beta * beta, 0.0)))
    if sc < np.sqrt(EIG_TOL) * max(1.0, np.sqrt(max(q[second, second], 0.0))):
        sc = 0.0
    return first, second, s1, beta, sc


class _Engine:
    """Tables and pattern sums at one resolution for one state (module docstring, step 3)."""

    def __init__(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray, level: float, rest_min: int = 0,
                 groups: tuple[ColumnGroup, list[ColumnGroup]] | None = None) -> None:
        self.task, self.act, self.level = task, act, level
        self.rest_min = int(rest_min)
        self.H = M.shape[0]
        self.a = np.asarray(a, dtype=float)
        self.c = np.asarray(b, dtype=float) + act.offsets(np.diag(Q))
        # the score laws do not depend on the resolution: the rungs of a ladder share them
        self.noise_group, self.signal_groups = groups or column_groups(task, M, Q)
        self.norm = act.norm
        signal = [self._nodes(g) for g in self.signal_groups]
        # the nested per-head rule stacks the signal groups (``merged_column``; on the flat
        # rules each θ-part atom would be a new table: measured 9–24 % slower for bsoftmax
        # and relu); the u grids bound each group's moments on its own (as before the merge)
        self._signal_parts = signal
        self.cols = {"noise": [self._nodes(self.noise_group)],
                     "signal": ([merged_column(signal, self.c)]
                                if len(signal) > 1 and hasattr(signal[0], "w1") else signal)}
        self._tables: dict = {}
        self._kernels: dict = {}
        self._recording: dict | None = None
        # per-head activations: one u grid per head (their ψ ranges can be far apart, e.g.
        # b = ±1000); joint ones and H = 1 share one grid (``self.ug``)
        self.ugs, self.ug = [], None
        if self.norm == "per-head" and self.H == 2:
            self.ugs = [self._ugrid([h]) for h in range(self.H)]
        elif self.norm != "elementwise":
            self.ug = self._ugrid(list(range(self.H)))

    # -- nodes ----------------------------------------------------------------------
    def _nodes(self, group: ColumnGroup) -> _NodeColumn:
        H = self.H
        if self.norm == "elementwise":
            return self._gl_nodes(group)
        if self.norm == "per-head" and H == 2:
            return self._nested_nodes(group)
        z_level = Z_LEVEL * (JOINT3_Z if H == 3 else 1.0) * self.level
        A = whiten(group.cov)
        count = tensor_cost(tensor_rules(A, z_level), 1.0) if A.size else 1.0
        self._check_memory(8.0 * count * (NODE_ARRAYS + 2 * H), " for its score nodes")
        y, w, _ = gaussian_nodes(A, z_level, 0.0, None)
        s = [group.mean[h] + y[:, h] for h in range(H)]
        return _NodeColumn(self.act, self.c, group, s, w)

    def _nested_nodes(self, group: ColumnGroup) -> _NodeColumn:
        """s_f = μ_f + σ_1 z_1 and s_g = μ_g + β z_1 + σ_c z_2, f the head of larger variance."""
        q = group.cov
        first, second, s1, beta, sc = nested_factors(q)
        z1, w1 = trapezoid_normal(s1, Z_LEVEL * self.level)
        z2, w2 = trapezoid_normal(sc, Z_LEVEL * self.level)
        self._check_memory(8.0 * NODE_ARRAYS * len(z1) * len(z2), " for its score nodes")
        s = [None, None]
        s[first] = (group.mean[first] + s1 * z1)[:, None]
        s[second] = group.mean[second] + beta * z1[:, None] + sc * z2[None, :]
        col = _NodeColumn(self.act, self.c, group, s, np.outer(w1, w2))
        col.first, col.w1, col.w2 = first, w1, w2  # type: ignore[attr-defined]
        return col

    def _gl_nodes(self, group: ColumnGroup) -> _NodeColumn:
        """Composite Gauss–Legendre nodes split at the kinks of φ (nested for two heads)."""
        H = self.H
        k = kinks(self.act)
        q = group.cov
        if H == 1:
            sd = np.sqrt(max(q[0, 0], 0.0))
            z, w = self._gl_1d(k, group.mean[0] + self.c[0], sd)
            return _NodeColumn(self.act, self.c, group, [group.mean[0] + sd * z], w)
        first, second, s1, beta, sc = nested_factors(q)
        z1, w1 = self._gl_1d(k, group.mean[first] + self.c[first], s1)
        base = group.mean[second] + beta * z1
        z2, w2 = self._gl_1d(k, base + self.c[second], sc, batch=len(z1))
        s = [None, None]
        s[first] = np.repeat((group.mean[first] + s1 * z1)[:, None], z2.shape[1], axis=1)
        s[second] = base[:, None] + sc * z2
        return _NodeColumn(self.act, self.c, group, [x.ravel() for x in s],
                           (w1[:, None] * w2).ravel())

    def _gl_1d(self, k: np.ndarray, centre: object, sd: float, batch: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        shape = () if batch is None else (batch,)
        if sd <= 0:
            return np.zeros(shape + (1,)), np.ones(shape + (1,))
        centre = np.broadcast_to(np.asarray(centre, dtype=float), shape)
        cuts = (k - centre[..., None]) / sd if k.size else np.full(shape + (0,), np.nan)
        return piecewise_gauss_legendre_normal(cuts, GL_LEVEL * self.level)

    # -- u grid ----------------------------------------------------------------------
    def _ugrid(self, heads: list[int]):
        """u grid from the ψ range of the nodes.  The lower end uses moments rather than max ψ:
        below u_lo every pattern is ≤ Σ_k e^{k u_lo} E[φ^k] (k its normaliser count), so
        u_lo = −max_k (log E[φ^k] + U_LOW)/k cuts ≤ e^{−U_LOW} (k ≤ 8 covers every field);
        with κ > 0 also u_lo ≤ −log κ − U_LOW, for the κ term of the mass check."""
        lo, hi, top = np.inf, -np.inf, -np.inf
        for cols in (self.cols["noise"], self._signal_parts):
            for col in cols:
                w = np.broadcast_to(col.w, col.shape)
                arrays = ([self._log_total(col)] if self.norm == "joint"
                          else [col.psi(h) for h in heads])
                for psi in arrays:
                    psi = np.broadcast_to(psi, col.shape)
                    fin = np.isfinite(psi)
                    if not fin.any():
                        continue
                    p_lo, p_hi = float(psi[fin].min()), float(psi[fin].max())
                    lo, hi = min(lo, p_lo), max(hi, p_hi)
                    top = max(top, _moment_bound(psi[fin], w[fin], p_hi))
        if not np.isfinite(hi):
            raise ValidationError(f"activation '{self.act.name}': phi vanishes on the whole "
                                  "score range, so the normaliser is zero")
        # the whole ψ span (up to MAX_PSI_SPAN, as the error engine): with a wide score
        # distribution every token of a sample can sit far below the largest ψ, so the
        # default clip at 200 lost mass (Q = 400, L = 2: E off by 1e−2); the mass check
        # reports anything beyond
        low = min(top, hi + U_LOW)
        if self.act.kappa > 0:
            # the κ term of the mass check, ∫ κ t e^{−κt} du, has the tail κ e^{u_lo} below
            # u_lo whatever the heads do: with every head silent (b ≈ −11, log E φ ≈ −10) the
            # moment bound alone cut it at u ≈ −22 and the check reported ~1e−10 per
            # normaliser that E did not have (b = −30: 3e−2)
            low = max(low, math.log(self.act.kappa) + U_LOW)
        ug = u_grid(lo, low, self.act.kappa, self.level, low_margin=0.0,
                    step=U_STEP, max_span=MAX_PSI_SPAN)
        return self._cut_top(self._stretch_low(ug, largest_psi(hi, self.act.kappa)), heads)

    def _stretch_low(self, ug: UGrid, psi_max: float) -> UGrid:
        """The same u range with 1 + ``STRETCH`` times wider steps in the lower tail.

        The trapezoid step h is set by the strip |Im u| < π/2 where e^{−tφ} stays bounded.
        Below u_c = −ψ_max − ``STRETCH_GAP`` every tφ ≤ e^{−6} (ψ_max counts κ as a token of
        ψ = log κ, ``quadrature.largest_psi``: so also κt ≤ e^{−6}), so there e^{−tφ} is bounded
        in any strip and the integrand (~ e^{ku} times a convergent series in t) is analytic
        far wider.  Substituting u = g(v) = v − A w softplus((v_c − v)/w) (A = ``STRETCH``,
        w = ``STRETCH_WIDTH``, v_c = u_c) keeps g(v) = v in the bulk and g′ → 1 + A in the tail;
        g is analytic in |Im v| < π w, and the trapezoid in v with the same step h covers the
        ~32 units of tail that U_LOW asks for in a quarter of the points."""
        v_c = -psi_max - STRETCH_GAP
        lo, hi = float(ug.u[0]), float(ug.u[-1])
        if lo >= v_c - STRETCH_WIDTH or len(ug.u) < 2:
            return ug
        A, wd = STRETCH, STRETCH_WIDTH

        def g(v: np.ndarray) -> np.ndarray:
            return v - A * wd * np.logaddexp(0.0, (v_c - v) / wd)

        def dg(v: np.ndarray) -> np.ndarray:
            return 1.0 + A * special.expit((v_c - v) / wd)

        v_lo = (lo + A * v_c) / (1.0 + A)
        for _ in range(30):                   # Newton on g(v) = lo (g is convex, increasing)
            step = float((g(np.array(v_lo)) - lo) / dg(np.array(v_lo)))
            v_lo -= step
            if abs(step) < 1e-14:             # converged (quadratically): the rest moves < 1e-28
                break
        h = float(ug.u[1] - ug.u[0])
        v = v_lo + h * np.arange(int(np.ceil((hi - v_lo) / h)) + 1)
        u = g(v)
        with np.errstate(over="ignore"):
            damp = (np.exp(-self.act.kappa * np.exp(u)) if self.act.kappa > 0
                    else np.ones_like(u))
        return UGrid(u, h * dg(v) * damp)

    def _cut_top(self, ug: UGrid, heads: list[int]) -> UGrid:
        """Drop the top of the u grid where every pattern is negligible.

        Every pattern holds at least ``rest_min`` plain noise tokens, each a factor
        T_1(u) = E_noise[e^{−Σ_h t_h φ_h}] ≤ E[e^{−t φ_h}] (one head's marginal, 1-D), and all
        its other factors are bounded: (tφ)^k e^{−tφ} ≤ k^k e^{−k} times the moments of the
        linear atoms, ≤ e^{``LOG_PATTERN_BOUND``} together.  So beyond the first u with
        rest_min · log T_1(u) < −(LOG_PATTERN_BOUND + U_TOP_CUT) the integrand of every pattern
        is below e^{−U_TOP_CUT}.  T_1 falls like P(ψ < −u)^rest_min, so with L = 10 this halves
        the u range that ψ_min (score −8.5σ) would ask for."""
        if self.rest_min <= 0 or len(ug.u) < 2:
            return ug
        g = self.noise_group
        log_t1 = np.full(len(ug.u), np.inf)
        for h in heads:
            sd = float(np.sqrt(max(g.cov[h, h], 0.0)))
            z, w = trapezoid_normal(sd, Z_LEVEL * self.level)
            psi = log_phi(self.act, sd * z + self.c[h])
            fin = np.isfinite(psi)
            with np.errstate(over="ignore", divide="ignore"):
                t1 = np.exp(-np.exp(np.minimum(ug.u[:, None] + psi[None, fin], X_CLIP))) @ w[fin]
                # + the Gaussian mass beyond the trapezoid's ±Z_RANGE (where ψ may be −∞)
                log_t1 = np.minimum(log_t1, np.log(t1 + GAUSS_TAIL))
        below = np.nonzero(self.rest_min * log_t1 < -(LOG_PATTERN_BOUND + U_TOP_CUT))[0]
        if not below.size:
            return ug
        end = int(below[0]) + 1
        return UGrid(ug.u[:end], ug.w[:end])

    # -- patterns ----------------------------------------------------------------------
    def table(self, kind: str, m: Mono, act_set: tuple) -> np.ndarray | float:
        """T_m on the column kind ("noise"/"signal", atom-averaged), shape of the u grid.

        A projection atom P_f = Σ_h R_fh S_h + r_f is resolved into score tables, so dM and
        dQ_lin share their tables."""
        key = (kind, m, act_set)
        if key in self._tables:
            return self._tables[key]
        base, f = split_p(m)
        cols = self.cols[kind]
        if f is None and len(cols) == 1 and cols[0].group.weight == 1.0:
            total = self._column_table(cols[0], m, act_set)      # one column: no copy
            if self._recording is None:
                self._tables[key] = total
            return total
        terms = []                                       # (column table, coefficient)
        for col in cols:
            grp = col.group
            if f is None:
                terms.append((self._column_table(col, m, act_set), grp.weight))
                continue
            for h in range(self.H):
                if grp.R[f, h] != 0.0:
                    with_s = tuple(sorted(base + (f"S{h}",)))
                    terms.append((self._column_table(col, with_s, act_set),
                                  grp.weight * grp.R[f, h]))
            if grp.rbar[f] != 0.0 and col.rnode is not None:   # θ parts per node
                terms.append((self._column_table(col, tuple(sorted(base + (f"r{f}",))),
                                                 act_set), 1.0))
            elif grp.rbar[f] != 0.0:
                terms.append((self._column_table(col, base, act_set), grp.rbar[f]))
        total = _linear_combination(terms)
        if self._recording is None:
            self._tables[key] = total
        return total

    def _column_table(self, col: _NodeColumn, m: Mono, act_set: tuple) -> np.ndarray | float:
        key = (id(col), m, act_set)
        if key in self._tables:
            return self._tables[key]
        if self._recording is not None:
            self._recording.setdefault(id(col), (col, set()))[1].add((m, act_set))
            return 0.0
        k, beta = atom_counts(m, self.H)
        if self.norm == "per-head" and self.H == 2:
            val = self._nested_table(col, m, k, beta, act_set)
        else:
            val = self._flat_table(col, m, k, beta, act_set)
        self._tables[key] = val
        return val

    def _flat_table(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                    act_set: tuple) -> np.ndarray | float:
        v = col.w * col.linear(m)
        if self.norm == "elementwise":
            for x in m:
                if x[0] in "WD":
                    v = v * col.raw(int(x[1:]), x[0])
            return float(np.sum(v))
        if not act_set:
            return float(np.sum(v))
        v = self._flat_weights(col, m, k, beta, slice(None))
        return self._kernel(col, int(k.sum())) @ v

    def _log_total(self, col: _NodeColumn) -> np.ndarray:
        key = (id(col), "logphi")
        if key not in self._kernels:
            with np.errstate(divide="ignore"):
                self._kernels[key] = np.logaddexp.reduce(
                    np.stack([col.psi(h) for h in range(self.H)]), axis=0)
        return self._kernels[key]

    def _kernel(self, col: _NodeColumn, k: int) -> np.ndarray:
        """exp(k X − e^X), X = u + log Σ_h φ_h, shape (U, nodes); X clipped at ``X_CLIP``."""
        key = (id(col), k)
        if key not in self._kernels:
            base = (id(col), "base")
            if base not in self._kernels:
                X = np.minimum(self.ug.u[:, None] + self._log_total(col)[None, :], X_CLIP)
                eX = np.exp(X)
                self._kernels[base] = (eX, flush(np.exp(-eX)))
            eX, K0 = self._kernels[base]
            self._kernels[key] = flush(K0 * eX ** k) if k else K0
        return self._kernels[key]

    def _nested_table(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                      act_set: tuple) -> np.ndarray | float:
        """Per-head, two heads: T(u_0, u_1) = Σ_{z1} O(u_f, z1) I(u_g, z1) (module docstring)."""
        f = col.first
        g = 1 - f
        inner = self._nested_inner(col, m, g, int(k[g]), int(beta[g]), g in act_set)
        outer_w = self._outer_weight(col, int(beta[f]), _r_atoms(m))
        if f in act_set:
            outer = self._nested_kernel(col, f, int(k[f])) * outer_w[None, :]   # (U, n1)
            val = outer @ inner.T if g in act_set else outer @ inner
        else:
            val = inner @ outer_w if g in act_set else float(inner @ outer_w)
        if f in act_set and g in act_set and f == 1:
            val = val.T                                              # axes in head order
        return val

    def _outer_weight(self, col: _NodeColumn, beta: int, r_atoms: Mono) -> np.ndarray:
        """w_1 (φ′_f/φ_f)^β × the θ-part atoms r (constant along z_2, so they stay out of the
        inner sums) at the z_1 nodes of the nested rule."""
        out = col.w1 * (col.ratio(col.first)[:, 0] ** beta if beta else 1.0)
        for x in r_atoms:
            out = out * col.rnode[int(x[1:])][:, 0]
        return out

    def _nested_inner(self, col: _NodeColumn, m: Mono, g: int, k: int, beta: int,
                      active: bool) -> np.ndarray:
        """I(u_g, z1) = Σ_{z2} w2 (tφ_g)^k (φ′_g/φ_g)^β × (S, P atoms) e^{−t_g φ_g}, or the same
        without u when head g has no normaliser in the pattern."""
        lin = tuple(x for x in m if x[0] in "SP")
        key = (id(col), "inner", lin, k, beta, bool(active))
        if key in self._kernels:
            return self._kernels[key]
        if active:              # the split kernel, never the whole (U, n1, n2) array
            self._batch_inner(col, g, [key[2:]])
            return self._kernels[key]
        inner_w = col.w2[None, :] * col.linear(lin)
        if beta:
            inner_w = np.nan_to_num(inner_w * col.ratio(g) ** beta, nan=0.0)
        out = np.sum(np.broadcast_to(inner_w, col.shape), axis=1)    # (n1,)
        self._kernels[key] = out
        return out

    def _nested_kernel(self, col: _NodeColumn, h: int, k: int) -> np.ndarray:
        """exp(k x − e^x), x = u + ψ_h at the nodes of head h; x clipped at ``X_CLIP`` (beyond
        it the value underflows anyway), so the powers are products, not new exponentials."""
        key = (id(col), "nested", h, k)
        if key not in self._kernels:
            if k == 0:
                psi = col.psi(h)
                psi = psi[:, 0] if h == col.first else psi
                with np.errstate(over="ignore", invalid="ignore"):
                    x = np.minimum(self.ugs[h].u.reshape((-1,) + (1,) * psi.ndim) + psi[None],
                                   X_CLIP)
                    ex = np.exp(x)
                self._kernels[(id(col), "ex", h)] = ex
                self._kernels[key] = flush(np.exp(-ex))
            else:
                ex = self._kernels[(id(col), "ex", h)] if (id(col), "ex", h) in self._kernels \
                    else (self._nested_kernel(col, h, 0), self._kernels[(id(col), "ex", h)])[1]
                self._kernels[key] = flush(self._nested_kernel(col, h, k - 1) * ex)
        return self._kernels[key]

    def plain(self, kind: str, act_set: tuple) -> np.ndarray | float:
        return self.table(kind, (), act_set)

    def mass_defect(self) -> float:
        """max |E[κ/N] + E[Σ W] − 1| over the normalisers (an exact identity), from the same
        tables and u grids: a check on the u range and rules that floors every abs_err."""
        return _defect(self.mass_totals())

    def mass_totals(self, heads: tuple | None = None) -> dict:
        """E[κ/N] + E[Σ W] per normaliser (act_set → total; ``heads``: those normalisers only),
        as u sums over this engine's grids (sums over u windows add up: ``bounded``)."""
        if self.norm == "elementwise":
            return {}
        L, kappa = self.task.L, self.act.kappa
        if self.ugs:
            checks = [((h,), self.ugs[h], [h]) for h in range(self.H)
                      if heads is None or h in heads]
        else:
            checks = [(("t",), self.ug, list(range(self.H)) if self.norm == "joint" else [0])]
        out = {}
        for act_set, ug, heads in checks:
            Ts, Tn = self.plain("signal", act_set), self.plain("noise", act_set)
            total = 0.0
            if kappa > 0:       # κ t e^{−κt} du: the weights hold du e^{−κt} (0 where it underflows)
                with np.errstate(over="ignore", invalid="ignore"):
                    kt = np.where(ug.w > 0, kappa * np.exp(ug.u) * ug.w, 0.0)
                total = float(np.sum(kt * Ts * Tn ** (L - 1)))
            for h in heads:
                m = (f"W{h}",)
                total += float(np.sum(ug.w * (self.table("signal", m, act_set) * Tn ** (L - 1)
                                              + (L - 1) * self.table("noise", m, act_set)
                                              * Ts * Tn ** (L - 2))))
            out[act_set] = total
        return out

    # -- bounded memory -----------------------------------------------------------------
    def bounded(self, pats: list["CompiledPattern"]) -> tuple[np.ndarray, float]:
        """(slot vector, mass defect) of ``pats``, holding at most about
        ``resources.engine_memory_budget()`` bytes at once.

        The per-head two-head rule holds tables of (U_0 × U_1) per monomial and inner sums of
        (U_g × n_1) per key: at key norm |k| every axis grows like |k|, and at |k| = 10 one
        evaluation held ~0.6 GB of tables (at |k| = 20 ~2.5 GB).  Every pattern sum is a sum
        over the u grid of its active heads, so when the estimate (:meth:`_nested_bytes`)
        exceeds the budget the grid of one head (``axis``, the inner head of the noise
        column: its inner sums then shrink with the window too) is cut into windows of
        ``rows`` points, each window is one engine over that part of the grid
        (:meth:`_window`), and the windows' sums are added: the first window takes every
        pattern, the others only those whose active set holds ``axis``, and the mass totals
        add up the same way.  Results differ from the one-window evaluation by the order of
        the float additions only (≤ ~1e−15 relative, measured).  A state whose nodes alone
        do not fit raises :class:`~theory_kit.model.validation.ResourceError` naming its key norm."""
        budget = resources.engine_memory_budget()
        if not (self.norm == "per-head" and self.H == 2):
            self._check_memory(self._flat_bytes(pats), "")
            self.prefetch(pats)
            return self.evaluate(pats), self.mass_defect()
        axis, fixed, per_row = self._nested_bytes(pats)
        n = len(self.ugs[axis].u)
        if fixed + per_row * n <= budget:
            self.prefetch(pats)
            return self.evaluate(pats), self.mass_defect()
        self._check_memory(fixed + per_row * MIN_WINDOW, f" even in windows of {MIN_WINDOW} "
                           f"u points (the grid has {n})")
        rows = int((budget - fixed) // per_row)
        total, totals = None, {}
        for lo in range(0, n, rows):
            sub = self._window(axis, slice(lo, lo + rows))
            use = pats if lo == 0 else _patterns_on(pats, self.norm, self.H, axis)
            sub.prefetch(use)
            v = sub.evaluate(use)
            total = v if total is None else total + v
            for key, t in sub.mass_totals(None if lo == 0 else (axis,)).items():
                totals[key] = totals.get(key, 0.0) + t
        return total, _defect(totals)

    def _window(self, axis: int, rows: slice) -> "_Engine":
        """This engine on the u points ``rows`` of head ``axis`` only (nodes shared)."""
        sub = copy.copy(self)
        sub.ugs = list(self.ugs)
        sub.ugs[axis] = UGrid(self.ugs[axis].u[rows], self.ugs[axis].w[rows])
        sub._tables, sub._kernels, sub._recording = {}, {}, None
        return sub

    def _check_memory(self, nbytes: float, how: str) -> None:
        """ResourceError when ``nbytes`` (the least this state can be evaluated in) exceeds
        ``resources.engine_memory_budget()``, naming the key norm max_h √Q_hh."""
        budget = resources.engine_memory_budget()
        if nbytes <= budget:
            return
        knorm = float(np.sqrt(max(float(np.max(np.diag(self.noise_group.cov))), 0.0)))
        raise ResourceError(
            f"resources: the laplace engine at key norm |k| = {knorm:.4g} (largest sqrt Q_hh) "
            f"and level {self.level:g} needs about {resources.human(nbytes)} of memory{how}, "
            f"over its budget of {resources.human(budget)} (a quarter of --max-memory, at most "
            f"{resources.human(resources.ENGINE_MEMORY)}); its grids grow like |k| per axis: "
            "use smaller keys, --engine mc, or raise --max-memory")

    def _flat_bytes(self, pats: list["CompiledPattern"]) -> float:
        """Bytes of one flat-rule evaluation (joint, H = 1, elementwise): the node arrays,
        one node chunk of kernels and the u tables."""
        nodes = sum(int(np.prod(col.shape)) for col in self.cols["noise"] + self.cols["signal"])
        U = len(self.ug.u) if self.ug is not None else 1
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        return 8.0 * (nodes * (NODE_ARRAYS + 2 * self.H) + 3 * min(FLAT_CHUNK, U * nodes)
                      + 2 * len(plan.keys) * U)

    def _nested_bytes(self, pats: list["CompiledPattern"]) -> tuple[int, float, float]:
        """(axis, fixed bytes, bytes per u point of ``axis``) of a per-head two-head
        evaluation on any window of ≥ ``MIN_WINDOW`` points of the grid of ``axis``, from the
        tables and keys its dry pass records.  What it holds to the end: the node arrays, the
        inner sums (J × U_g × n_1 per column), the outer kernels (k_f,max + 2 of U_f × n_1),
        the two-head tables (each column's, and the copies ``table`` combines for a P atom:
        U_0 × U_1 each), the measures with T_1^rest and ``evaluate``'s chain of prefix
        products (≤ L − 1 + 1 of them); plus the largest of the passing arrays: the blocks of
        ``_batch_inner`` (weights, their factors, the products R, the compiled kernel block)
        or the stacked inner sums and outer factor of ``_batch_column``.  Each part is
        linear in the window's size, except the blocks, bounded over all windows
        (:func:`_inner_block_rows`); the largest passing part is bounded by the maxima of the
        parts' fixed and per-point terms, so the estimate is not below the peak (measured
        with tracemalloc: test_laplace)."""
        cols = self.cols["noise"] + self.cols["signal"]
        items = self._recorded_items(pats, cols)
        axis = 1 - self.cols["noise"][0].first
        U = [len(ug.u) for ug in self.ugs]

        def entries(per_point: float, head: int | None, other: float = 1.0) -> np.ndarray:
            """(fixed, per point of axis) entries of an array of per_point × U_head × other,
            or of U_0 × U_1 × per_point with head None."""
            if head is None:
                return np.array([0.0, per_point * U[1 - axis]])
            if head == axis:
                return np.array([0.0, per_point * other])
            return np.array([per_point * other * U[head], 0.0])

        held = np.zeros(2)
        passing = np.zeros(2)
        for col, its in zip(cols, items):
            f, g = col.first, 1 - col.first
            n1, n2 = col.shape
            J, kf_max, n_kg, n_both = _column_counts(its, self.H, f)
            held += [NODE_ARRAYS * float(n1 * n2), 0.0]
            held += entries(J, g, n1) + entries(kf_max + 2.0, f, n1) + entries(n_both, None)
            if J:
                _, w_rows = _inner_block_rows(MIN_WINDOW, n1, n2, J, bound=True)
                blocks = (np.array([(J + n_kg + 4.0) * w_rows * n2 + INNER_BLOCK, 0.0])
                          + entries(w_rows * J + n2 + J, g))
                passing = np.maximum(passing, blocks)
                passing = np.maximum(passing, entries(J, g, n1) + entries(1.0, f, n1))
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        copies = sum(1 for _, m, act_set in plan.keys
                     if len(act_set) == 2 and split_p(m)[1] is not None)
        measures = len({(act_set, rest) for act_set, _, rest, *_ in plan.groups
                        if len(act_set) == 2})
        chain = max((len(noise) for act_set, noise, *_ in plan.groups if len(act_set) == 2),
                    default=0)
        held += entries(copies + 3.0 * measures + chain + 1.0, None)
        fixed, per_row = held + passing
        return axis, 8.0 * fixed, 8.0 * per_row

    # -- batched per-head tables ------------------------------------------------------
    def prefetch(self, pats: list["CompiledPattern"]) -> None:
        """Compute every per-head two-head table the patterns need in a few large BLAS calls:
        a dry pass records the (column, monomial, active set) keys, then the inner sums of all
        monomials of one column are one batched matrix product, and the outer contraction of all
        tables sharing an outer factor is one more."""
        if self.norm == "elementwise":
            return
        cols = self.cols["noise"] + self.cols["signal"]
        nested = self.norm == "per-head" and self.H == 2
        for col, items in zip(cols, self._recorded_items(pats, cols)):
            if not items:
                continue
            if nested:
                self._batch_column(col, items)
            else:
                self._batch_flat(col, items)

    def _recorded_items(self, pats: list["CompiledPattern"], cols: list[_NodeColumn]) -> list:
        """The sorted (monomial, active set) keys each column's tables need, from a dry pass
        of :meth:`evaluate`; cached per pattern list and the zero pattern of each column's
        projection (R, r̄), which is all the keys depend on (a drift's dry pass was ~6 % of it)."""
        key = (id(pats), self.norm, self.H, self.task.L, len(self.cols["noise"]),
               tuple((tuple(c.group.R.ravel() != 0), tuple(c.group.rbar != 0)) for c in cols))

        def record() -> list:
            self._recording = {}
            self.evaluate(pats)
            recorded, self._recording = self._recording, None
            return [sorted(recorded[id(c)][1]) if id(c) in recorded else [] for c in cols]

        return _cached_for(_RECORDED, key, pats, record)

    def _batch_flat(self, col: _NodeColumn, items: list) -> None:
        """One shared t: T_m(u) = Σ_G K_k(u, G) v_m(G) for all monomials m of the column, in
        node chunks (the kernel K_k = exp(k X − e^X), X = u + log Σ_h φ_h, is never stored whole)."""
        by_k: dict[int, list] = {}
        for m, act_set in items:
            if not act_set:
                self._tables[(id(col), m, act_set)] = self._flat_table(
                    col, m, *atom_counts(m, self.H), act_set)
                continue
            k, beta = atom_counts(m, self.H)
            by_k.setdefault(int(k.sum()), []).append((m, act_set, k, beta))
        if not by_k:
            return
        logphi = self._log_total(col)
        G = logphi.shape[0]
        u = self.ug.u
        out = {kk: np.zeros((len(u), len(ms))) for kk, ms in by_k.items()}
        step = max(1, int(FLAT_CHUNK // max(1, len(u))))
        for lo in range(0, G, step):
            sl = slice(lo, min(G, lo + step))
            with np.errstate(over="ignore"):
                X = np.minimum(u[:, None] + logphi[None, sl], X_CLIP)
                eX = np.exp(X)
            K = flush(np.exp(-eX))
            power = 0
            for kk in sorted(by_k):
                while power < kk:
                    K = flush(K * eX)
                    power += 1
                V = np.empty((sl.stop - sl.start, len(by_k[kk])))
                for j, (m, _, k, beta) in enumerate(by_k[kk]):
                    V[:, j] = self._flat_weights(col, m, k, beta, sl)
                out[kk] += K @ V
        for kk, ms in by_k.items():
            for j, (m, act_set, _, _) in enumerate(ms):
                self._tables[(id(col), m, act_set)] = out[kk][:, j]

    def _flat_weights(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                      sl: slice) -> np.ndarray:
        """w_G × (S atoms) × Π_h (φ_h/Σφ)^{k_h} (φ′_h/φ_h)^{β_h} at the nodes ``sl``."""
        v = col.w[sl] * np.broadcast_to(col.linear(m), col.shape)[sl]
        logphi = self._log_total(col)[sl]
        n_w = m.count("w")
        if n_w:
            share = sum(self.a[h] * np.exp(col.psi(h)[sl] - logphi) for h in range(self.H))
            v = v * share ** n_w
        for h in range(self.H):
            kh = k[h] - (n_w if h == 0 else 0)
            if kh:
                v = v * np.exp(kh * (col.psi(h)[sl] - logphi))
            if beta[h]:
                v = v * col.ratio(h)[sl] ** beta[h]
        return np.nan_to_num(v, nan=0.0)

    def _batch_column(self, col: _NodeColumn, items: list) -> None:
        f, g = col.first, 1 - col.first
        info = []
        for m, act_set in items:
            k, beta = atom_counts(m, self.H)
            lin = tuple(x for x in m if x[0] in "SP")
            info.append((m, act_set, (lin, int(k[g]), int(beta[g]), g in act_set),
                         (int(k[f]), int(beta[f]), f in act_set, _r_atoms(m))))
        active = sorted({ik for *_, ik, _ in info if ik[3]})
        if active:
            self._batch_inner(col, g, active)
        groups: dict = {}
        single: dict = {}
        for m, act_set, ik, ok in info:
            if ik[3] and ok[2]:
                groups.setdefault(ok, []).append((m, act_set, ik))
            elif ik[3] or ok[2]:
                single.setdefault((ok, ik[3]), []).append((m, act_set, ik))
            else:
                self._tables[(id(col), m, act_set)] = self._nested_table(
                    col, m, *atom_counts(m, self.H), act_set)
        self._batch_single(col, single)
        for (kf, bf, _, r_atoms), members in groups.items():
            outer_w = self._outer_weight(col, bf, r_atoms)
            outer = flush(self._nested_kernel(col, f, kf) * outer_w[None, :])    # (U, n1)
            # members with the same inner sums share their table (it is fixed by the two keys)
            unique = list(dict.fromkeys(ik for _, _, ik in members))
            stack = np.stack([self._kernels[(id(col), "inner") + ik] for ik in unique])
            J, Ug, n1 = stack.shape
            # every table C-contiguous with its axes in head order (u_0, u_1): the pattern
            # sums read each several times (strided views made them ~2× slower)
            if f == 1:                                   # (J Ug, n1)(n1, Uf) → [j, u_0, u_1]
                vals = (stack.reshape(J * Ug, n1) @ outer.T).reshape(J, Ug, outer.shape[0])
            else:
                vals = np.ascontiguousarray((outer @ stack.reshape(J * Ug, n1).T).reshape(
                    outer.shape[0], J, Ug).transpose(1, 0, 2))
            where = {ik: j for j, ik in enumerate(unique)}
            for m, act_set, ik in members:
                self._tables[(id(col), m, act_set)] = vals[where[ik]]

    def _batch_single(self, col: _NodeColumn, single: dict) -> None:
        """The tables with one active head (``_nested_table``'s one-head cases), one matrix
        product per outer factor instead of one small product per table."""
        f, g = col.first, 1 - col.first
        for ((kf, bf, _, r_atoms), g_active), members in single.items():
            outer_w = self._outer_weight(col, bf, r_atoms)
            inners = np.stack([self._nested_inner(col, ik[0], g, ik[1], ik[2], ik[3])
                               for _, _, ik in members])
            if g_active:                                     # (J, U_g, n1) · (n1,) → (J, U_g)
                vals = inners @ outer_w
            else:                                            # (J, n1) · (n1, U_f) → (J, U_f)
                vals = inners @ (self._nested_kernel(col, f, kf) * outer_w[None, :]).T
            for j, (m, act_set, _) in enumerate(members):
                self._tables[(id(col), m, act_set)] = vals[j]

    def _batch_inner(self, col: _NodeColumn, g: int, keys: list) -> None:
        """I_j(u, z1) = e^{k_j(u+c)} Σ_{z2} e^{−e^{u+ψ}} [w2 lin_j ratio^β_j e^{k_j(ψ−c)}] for all
        keys at once (c keeps both exponentials in range), in blocks of z_1 rows, so that no
        array but the result (J, U, n1) grows with the whole grid.

        The split loses only terms with e^{k(ψ−c)} < ``TINY`` (flushed), worth at most
        e^{k(u+c)} ``TINY`` ≤ e^{SPLIT_MAX − 644} ≈ 1e−28 of O(1) entries when
        k (u + c) ≤ ``SPLIT_MAX``; a term far below c matters only at u ≈ −ψ ≤ u_max, so that
        one bound covers the whole score range.  Where one c cannot hold both exponentials
        in range (wide score ranges: the ψ span times k_max beyond ~``SPLIT_MAX``), the u grid
        is cut into segments of width ≤ ``SPLIT_MAX``/(2 k_max), each with its own
        c ≤ SPLIT_MAX/k_max − (its top u): there k (ψ − c) may exceed ``SPLIT_MAX`` only where
        u + ψ ≥ SPLIT_MAX/(2 k_max) ≥ 36 in the whole segment, so e^{−e^{u+ψ}} is exactly 0 and
        the factor is clipped at e^{SPLIT_MAX} (finite, times 0).  The segments replace the
        fall-back to the direct (U, n1, n2) kernels, which asked for 9.7 GB at |k| = 10
        (the one-segment case is the same computation as before, bit for bit)."""
        psi = col.psi(g)                                                         # (n1, n2)
        fin = psi[np.isfinite(psi)]
        kmax = max(max(k for _, k, _, _ in keys), 1)
        u = self.ugs[g].u
        psi_max = float(fin.max())
        # c ≤ max ψ lowered as far as k (u + c) ≤ SPLIT_MAX asks; then e^{k(ψ−c)} may exceed 1,
        # by at most e^{SPLIT_MAX} (else segments)
        c = min(psi_max, SPLIT_MAX / kmax - float(u[-1]))
        if kmax * (psi_max - c) <= SPLIT_MAX:
            segments = [(0, len(u), c)]
        else:
            width = SPLIT_MAX / (2.0 * kmax)
            segments, lo = [], 0
            while lo < len(u):
                hi = int(np.searchsorted(u, u[lo] + width, side="right"))
                segments.append((lo, hi, min(psi_max, SPLIT_MAX / kmax - float(u[hi - 1]))))
                lo = hi
        # NaN (0 · ∞ where φ = 0) can only come from ψ = −∞ or the ratio φ′/φ: for φ = e^s
        # every factor is finite and the NaN scan is skipped
        finite = fin.size == psi.size
        ks = np.array([k for _, k, _, _ in keys])
        inner = np.empty((len(keys), len(u), psi.shape[0]))                      # (J, U, n1)
        n1, n2 = psi.shape
        rows, w_rows = _inner_block_rows(len(u), n1, n2, len(keys))
        for u_lo, u_hi, c in segments:
            us = u[u_lo:u_hi]
            eu = np.exp(us + c)
            scale = np.exp(np.outer(us + c, ks))                                 # (U, J)
            for w_lo in range(0, n1, w_rows):
                w_hi = min(w_lo + w_rows, n1)
                W = self._inner_weights(col, g, keys, c, slice(w_lo, w_hi), finite)
                ep = np.exp(psi[w_lo:w_hi] - c)
                R = np.empty((w_hi - w_lo, u_hi - u_lo, len(keys)))
                for lo in range(0, w_hi - w_lo, rows):
                    hi = min(lo + rows, w_hi - w_lo)
                    # e^{u+ψ} = e^{u+c} e^{ψ−c}: both factors are finite here, so one
                    # exponential per entry; ``_minus_exp_product`` writes 0 (not a
                    # subnormal) where e^{−e^x} < 1e−280
                    np.matmul(_minus_exp_product(eu, ep[lo:hi]), W[lo:hi], out=R[lo:hi])
                R *= scale[None, :, :]
                inner[:, u_lo:u_hi, w_lo:w_hi] = R.transpose(2, 1, 0)
        for j, key in enumerate(keys):
            self._kernels[(id(col), "inner") + key] = inner[j]

    def _inner_weights(self, col: _NodeColumn, g: int, keys: list, c: float, rows: slice,
                       finite: bool) -> np.ndarray:
        """w2 lin_j ratio^β_j e^{k_j(ψ−c)} at the z_1 rows ``rows`` (rows, n2, J), flushed;
        the exponent is clipped at ``SPLIT_MAX`` (``_batch_inner``: only where the kernel is 0)."""
        psi = col.psi(g)[rows]
        W = np.empty(psi.shape + (len(keys),))
        with np.errstate(invalid="ignore"):
            grow = {k: np.exp(np.minimum(k * (psi - c), SPLIT_MAX))
                    for k in {k for _, k, _, _ in keys} if k}
        for j, (lin, k, beta, _) in enumerate(keys):
            w = col.w2[None, :] * col.linear(lin, rows)
            if beta:
                w = w * col.ratio(g)[rows] ** beta
            if k:
                w = w * grow[k]
            W[..., j] = w if finite and not beta else np.nan_to_num(
                np.broadcast_to(w, psi.shape), nan=0.0)
        return flush(W)

    def evaluate(self, pats: list["CompiledPattern"]) -> np.ndarray:
        """Σ over patterns of coefficient × ∫ measure × T_sig × Π T_noise × T_1^{L−1−n}.

        Patterns are summed through their :class:`PatternPlan`: the product of the measure,
        the noise tables and T_1^{rest} is formed once per group of patterns sharing it, and
        each member adds one dot product with its signal table (scaled by 1/Γ(k)).  The groups
        come sorted, so those sharing a prefix of their noise tables are adjacent: each
        prefix product is formed once, and only the current group's chain of them (≤ L − 1
        arrays) is held, not every prefix of the list (at key norm 3.4, 287 two-head
        products of 170 kB: the tracemalloc peak of a rung fell from 46.5 to 30.0 MiB)."""
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        tabs = [self.table(kind, m, act_set) for kind, m, act_set in plan.keys]
        if self._recording is not None:
            return np.zeros(plan.coefs.shape[1])
        vals = np.zeros(len(plan.gscale))
        chain: list = []          # measure × T_1^rest × the first n noise tables, n = 1, 2, …
        last: tuple = ((), -1, ())
        for act_set, noise, rest, members, signals in plan.groups:
            shared = 0
            if last[:2] == (act_set, rest):
                while shared < min(len(noise), len(last[2])) and noise[shared] == last[2][shared]:
                    shared += 1
            del chain[shared:]
            last = (act_set, rest, noise)
            prod = chain[-1] if chain else self.weighted_power(act_set, rest)
            for n in range(shared, len(noise)):
                prod = prod * tabs[noise[n]]
                chain.append(prod)
            for j, s in zip(members, signals):
                t = tabs[s]
                vals[j] = float(np.vdot(prod, t)) if np.ndim(t) and np.ndim(prod) \
                    else float(np.sum(prod * t))
        return plan.coefs.T @ (vals * plan.gscale)

    def base_measure(self, act_set: tuple) -> np.ndarray | float:
        """Π_h w_u over the active normalisers (``measure`` without its 1/Γ(k))."""
        key = ("base_measure", act_set)
        if key not in self._kernels:
            if not act_set:
                val: np.ndarray | float = 1.0
            elif act_set == ("t",):
                val = self.ug.w
            else:
                ws = [self.ugs[h].w for h in act_set]
                val = ws[0] if len(ws) == 1 else np.multiply.outer(ws[0], ws[1])
            self._kernels[key] = val
        return self._kernels[key]

    def weighted_power(self, act_set: tuple, rest: int) -> np.ndarray | float:
        """The measure times T_1^rest (shared by every group with that active set and rest)."""
        key = ("weighted_power", act_set, rest)
        if key not in self._kernels:
            val = self.base_measure(act_set)
            if act_set and rest:
                val = val * self.power(act_set, rest)
            self._kernels[key] = val
        return self._kernels[key]

    def power(self, act_set: tuple, rest: int) -> np.ndarray:
        """T_1^rest, the plain noise tokens of a pattern."""
        key = ("power", act_set, rest)
        if key not in self._kernels:
            self._kernels[key] = self.plain("noise", act_set) ** rest
        return self._kernels[key]


@dataclass(frozen=True)
class PatternPlan:
    """How :meth:`_Engine.evaluate` sums a pattern list: the distinct tables (kind, monomial,
    active set) it reads, groups of patterns sharing (active set, noise tables, rest) — each
    group as (act_set, noise table indices, rest, member pattern indices, their signal table
    indices), sorted by (act_set, rest, noise) —, the per-pattern 1/Γ(k) factors
    (``gscale``) and the coefficient matrix (patterns × slots)."""

    keys: list
    groups: list
    gscale: np.ndarray
    coefs: np.ndarray


_PLANS: dict = {}
_RECORDED: dict = {}             # ``_Engine._recorded_items`` per pattern list and zero pattern


def pattern_plan(pats: list["CompiledPattern"], norm: str, H: int, L: int) -> PatternPlan:
    """The :class:`PatternPlan` of ``pats`` (cached per pattern list: the list is kept in the
    cache, so its id is not reused while the entry lives)."""
    return _cached_for(_PLANS, (id(pats), norm, H, L), pats,
                       lambda: _build_plan(pats, norm, H, L))


def _build_plan(pats: list["CompiledPattern"], norm: str, H: int, L: int) -> PatternPlan:
    index: dict = {}

    def idx(k: tuple) -> int:
        return index.setdefault(k, len(index))

    groups: dict = {}
    gscale = np.ones(len(pats))
    for j, p in enumerate(pats):
        k = np.asarray(p.k)
        act_set = _active_set(norm, H, k)
        sig = idx(("signal", p.signal, act_set))
        noise = tuple(idx(("noise", m, act_set)) for m in p.noise)
        rest = L - 1 - len(p.noise)
        if act_set and rest:
            idx(("noise", (), act_set))                # T_1, read by ``power``
        g = groups.setdefault((act_set, noise, rest), ([], []))
        g[0].append(j)
        g[1].append(sig)
        if act_set == ("t",):
            gscale[j] = 1.0 / math.gamma(int(k.sum()))
        else:
            for h in act_set:
                gscale[j] /= math.gamma(int(k[h]))
    # sorted by (active set, rest, noise tables): groups sharing a noise prefix are adjacent
    # (``_Engine.evaluate`` holds one chain of prefix products)
    order = sorted(groups.items(), key=lambda item: (item[0][0], item[0][2], item[0][1]))
    return PatternPlan(list(index), [(a, n, r, m, s) for (a, n, r), (m, s) in order],
                       gscale, np.array([p.coef for p in pats]).reshape(len(pats), -1))


_COUNTS: dict = {}


def _column_counts(items: list, H: int, f: int) -> tuple[int, int, int, int]:
    """(inner keys J, largest power k_f, distinct powers k_g > 0, two-head tables) of one
    column's recorded items, with f the column's outer head (``_Engine._nested_bytes``;
    cached with the recorded list)."""
    def build() -> tuple[int, int, int, int]:
        g = 1 - f
        inner, kf_max, kg, both = set(), 0, set(), 0
        for m, act_set in items:
            k, beta = atom_counts(m, H)
            if g in act_set:
                inner.add((tuple(x for x in m if x[0] in "SP"), int(k[g]), int(beta[g])))
                kg.add(int(k[g]))
            if f in act_set:
                kf_max = max(kf_max, int(k[f]))
            both += len(act_set) == 2
        return len(inner), kf_max, len(kg - {0}), both

    return _cached_for(_COUNTS, (id(items), H, f), items, build, limit=64)


def _inner_block_rows(U: int, n1: int, n2: int, J: int, bound: bool = False) -> tuple[int, int]:
    """(kernel rows, weight rows) of the z_1 blocks of ``_batch_inner`` for U u points and J
    keys: kernel blocks of ~``INNER_BLOCK`` entries (each still in cache for its product),
    weight blocks of whole kernel blocks and ~``WEIGHT_BLOCK`` entries (one along Fig. 1: per
    kernel block they cost 10 %).  With ``bound``, weight rows that hold for every U′ ≥ U
    (the kernel rows fall with U′, the weight rows stay ≤ max(WEIGHT_BLOCK/(n2 J), rows))."""
    rows = max(1, int(INNER_BLOCK // (U * n2)))
    if bound:
        return rows, min(n1, max(int(WEIGHT_BLOCK // (n2 * J)), rows))
    return rows, min(n1, rows * max(1, int(WEIGHT_BLOCK // (rows * n2 * J))))


def _defect(totals: dict) -> float:
    """max |total − 1| over the mass totals (``_Engine.mass_totals``; ∞ if one is not finite)."""
    worst = 0.0
    for total in totals.values():
        worst = max(worst, abs(total - 1.0)) if np.isfinite(total) else np.inf
    return worst


def _cached_for(cache: dict, key: tuple, obj: object, build: Callable[[], object],
                limit: int = 32) -> object:
    """``cache[key]`` if it was built for this very ``obj`` (key holds id(obj); the entry
    keeps obj alive, so its id is not reused while the entry lives), else ``build()``, stored."""
    hit = cache.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    if len(cache) > limit:
        cache.clear()
    value = build()
    cache[key] = (obj, value)
    return value


_ON_AXIS: dict = {}


def _patterns_on(pats: list["CompiledPattern"], norm: str, H: int, axis: int) -> list:
    """The patterns whose active set holds head ``axis`` (one list per pattern list, so that
    the plan and record caches keyed by the list's id see one list)."""
    return _cached_for(_ON_AXIS, (id(pats), norm, H, axis), pats, lambda: [
        p for p in pats if axis in _active_set(norm, H, np.asarray(p.k))])


def _linear_combination(terms: list) -> np.ndarray | float:
    """Σ_i c_i T_i in the order given (T_i arrays of one shape, or floats), accumulated in
    place: the same sum as 0 + c_0 T_0 + c_1 T_1 + …, without a new array per term."""
    total: np.ndarray | float = 0.0
    for t, c in terms:
        if isinstance(total, np.ndarray) and isinstance(t, np.ndarray):
            total += t * c
        else:
            total = total + t * c
    return total


def _active_set(norm: str, H: int, k: np.ndarray) -> tuple:
    """The normalisers present: head indices (per-head), ("t",) (joint, or one head) or ()."""
    if norm == "elementwise":
        return ()
    if norm == "joint" or H == 1:
        return ("t",) if k.sum() else ()
    return tuple(h for h in range(H) if k[h])


@dataclass(frozen=True)
class CompiledPattern:
    """A pattern with its coefficient vector and normaliser counts k_h (all blocks)."""

    signal: Mono
    noise: tuple[Mono, ...]
    coef: np.ndarray
    k: tuple[int, ...]


def compile_patterns(poly: TokenPoly, L: int, H: int, plain_exp: bool) -> list[CompiledPattern]:
    """:func:`patterns` with k_h precomputed; for φ = exp, D_h = W_h (tφ′ = tφ) is merged."""
    merged: dict[Pattern, np.ndarray] = {}
    for p, coef in patterns(poly, L).items():
        if plain_exp:
            p = Pattern(None if p.signal is None else _d_to_w(p.signal),
                        tuple(sorted(_d_to_w(m) for m in p.noise)))
        merged[p] = merged[p] + coef if p in merged else coef
    out = []
    for p, coef in merged.items():
        if not np.any(coef):
            continue
        signal = p.signal if p.signal is not None else ()
        k = np.zeros(H, dtype=int)
        for m in (signal,) + p.noise:
            k += atom_counts(m, H)[0]
        out.append(CompiledPattern(signal, p.noise, coef, tuple(int(x) for x in k)))
    return out


def _d_to_w(m: Mono) -> Mono:
    return tuple(sorted("W" + x[1:] if x[0] == "D" else x for x in m))


TINY = 1e-280                    # |x| below this is set to 0 (see ``flush``)
LOG_TINY = 644.0                 # e^{−644} ≈ 1.1e−280 (``_minus_exp_product``)
SPLIT_MAX = 580.0                # largest k (u + c) of the split inner kernel (``_batch_inner``)


# e^{−x} by range reduction: e^y = 2^n e^r, n = round(y / ln 2), |r| ≤ ln 2 / 2, e^r by its
# degree-13 Taylor polynomial (remainder r^14/14! < 3e−18 relative); ln 2 in two parts (Cody–Waite)
LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
_EXP_TAYLOR = tuple(1.0 / math.factorial(j) for j in range(13, -1, -1))


@numba.njit(cache=True, nogil=True)
def _minus_exp_product(eu: np.ndarray, ep: np.ndarray) -> np.ndarray:
    """E[i, k, l] = exp(−eu[k] ep[i, l]), 0 where x = eu[k] ep[i, l] ≥ ``LOG_TINY`` (values
    < 1e−280, see ``flush``), shape (n1, U, n2).

    The largest array of a drift evaluation (the nested per-head inner kernel), in one compiled
    pass: the inputs are the already-exponentiated e^{u+c} and e^{ψ−c}, and e^{−x} is computed
    without a libm call (range reduction and a polynomial, above), so that the loop over l
    vectorises: 2× less CPU than the scalar exp with its shortcuts (Taylor polynomial below
    x = 1e−6, 0 beyond ``LOG_TINY``), at ≤ 2.3e−16 relative to it (measured at a Fig. 1 plateau
    state: 101 × 115 × 71 entries)."""
    n1, n2 = ep.shape
    out = np.empty((n1, eu.shape[0], n2))
    bits = np.empty(n2, np.int64)
    scale = bits.view(np.float64)
    vals = np.empty(n2)
    for i in range(n1):
        for k in range(eu.shape[0]):
            e = eu[k]
            for j in range(n2):
                x = e * ep[i, j]
                y = -min(x, LOG_TINY + 1.0)
                n = np.floor(y * LOG2E + 0.5)
                r = (y - n * LN2_HI) - n * LN2_LO
                q = 0.0
                for coef in _EXP_TAYLOR:                   # Horner, highest degree first
                    q = q * r + coef
                bits[j] = (np.int64(n) + 1023) << 52          # 2^n, n ≥ −930: a normal number
                vals[j] = q if x < LOG_TINY else 0.0
            for j in range(n2):
                out[i, k, j] = vals[j] * scale[j]
    return out


def flush(x: np.ndarray) -> np.ndarray:
    """x with entries of magnitude < ``TINY`` set to 0, in place.  The kernels e^{k x − e^x}
    underflow gradually into subnormal numbers, which made BLAS products ~50× slower
    (measured: a 160 × 159 × 9760 product 0.01 s → 0.5 s); every value they can reach in
    a field is relative to O(1) terms, so nothing below 1e−280 can matter."""
    x[np.abs(x) < TINY] = 0.0
    return x


_CONTROLLER: list = []


def single_thread_blas() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread (threadpoolctl, when installed) for the many small matrix
    products here: on a loaded machine threaded BLAS made them ~50× slower (measured)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return contextlib.nullcontext()
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc ``mallopt`` parameters (malloc.h)
RETAINED_BYTES = 1 << 30         # freed heap memory kept by the process, up to this much
HEAP_BLOCK_BYTES = 32 << 20      # blocks up to this size come from the heap (glibc's maximum)


@lru_cache(maxsize=None)
def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory instead of returning it to the kernel.

    One rung allocates tens of MB of temporaries (kernels, tables, products) and frees them
    at its end; with glibc's default trim threshold (128 kB) the heap top goes back to the
    kernel every time, so the next rung page-faults and zeroes all of it again (measured on
    Fig. 1 drifts: ~6 of ~45 CPU ms per drift were system time, and the fresh pages slowed
    the user part too; with the threshold at 1 GB a drift took 1.2–1.35× less CPU, same
    run, fields bit for bit the same).  Setting the trim threshold freezes glibc's sliding
    mmap threshold, so blocks up to 32 MB are sent to the heap explicitly (otherwise every
    array above the threshold of the moment would be mapped and unmapped per use).
    Process-wide, set once when the engine is built; a no-op (False) where the C library is
    not glibc, or with ``THEORY_KIT_RETAIN_HEAP=0`` (the baseline of ``bench_ode.py --parts
    heap``)."""
    if os.environ.get("THEORY_KIT_RETAIN_HEAP", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES)
                    and libc.mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES))
    except (OSError, AttributeError):
        return False


def _moment_bound(psi: np.ndarray, w: np.ndarray, c: float, kmax: int = 8) -> float:
    """max_k (log Σ_i w_i e^{k ψ_i} + U_LOW) / k over k = 1 … kmax (``_Engine._ugrid``).

    With c = max ψ the powers of e^{ψ−c} ≤ 1 are running products (no overflow, kmax
    multiplications instead of kmax × n exponentials of a log-sum-exp)."""
    p = np.exp(psi - c)
    acc = np.asarray(w, dtype=float)
    best = -np.inf
    for k in range(1, kmax + 1):
        acc = acc * p
        total = float(acc.sum())
        if total > 0:
            best = max(best, (math.log(total) + k * c + U_LOW) / k)
    return best


# ============================================================================ public engine
def applicability(task: Task, act: Activation, H: int) -> tuple[bool, str]:
    """(True, "") when this engine reaches its target precision here, else (False, reason)."""
    prior = task.prior
    if not (prior.is_discrete or isinstance(prior, GaussianPrior)):
        return False, f"needs a discrete or Gaussian prior (got '{prior.name}')"
    if prior.is_discrete and len(prior.atoms()[1]) > mc.MAX_ENUMERATED_ATOMS:
        return False, f"enumerates the atoms: at most {mc.MAX_ENUMERATED_ATOMS}"
    if H > MAX_H[act.norm]:
        return False, f"{act.norm} activations need H <= {MAX_H[act.norm]} (got H = {H})"
    if task.L > MAX_L:
        return False, f"needs L <= {MAX_L} (got L = {task.L})"
    if act.norm != "elementwise":
        return _smooth_positive(act)
    return True, ""


@lru_cache(maxsize=32)
def _smooth_positive(act: Activation) -> tuple[bool, str]:
    """``applicability``'s test of a normalised φ (cached: every drift call asks it)."""
    if kinks(act).size:
        return False, "a normalised phi with kinks (the u and z trapezoid rules need a smooth phi)"
    probe = act.phi_numpy(np.linspace(-40.0, 40.0, 801))
    if not np.all(probe > 0):
        return False, "a normalised activation needs phi > 0 on the real line"
    return True, ""


@dataclass(frozen=True)
class _Anchor:
    """The state of an ODE step whose ladder ran (``LaplaceDrift.per_step_check``): its
    task and activation, flat state y, accepted level, and each field's largest abs_err."""

    task: Task
    act: Activation
    y: np.ndarray
    level: float
    spread: dict


def _flat_state(M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ravel(x).astype(float) for x in (M, Q, a, b)])


class LaplaceDrift:
    """Deterministic drift engine (module docstring) with the duck type of ``expect.drift``.

    ``level`` scales every rule's resolution (steps ∝ 1/level); ``abs_err`` per field is the
    difference to level × ``COARSE``."""

    fresh = False
    name = "laplace"

    def __init__(self, level: float = DEFAULT_LEVEL, tol: float = DEFAULT_TOL) -> None:
        if not (np.isfinite(level) and level > 0):
            raise ValidationError(f"level: must be a finite number > 0 (got {level!r})")
        if not (np.isfinite(tol) and tol > 0):
            raise ValidationError(f"tol: must be a finite number > 0 (got {tol!r})")
        self.level, self.tol = float(level), float(tol)
        self._poly_cache: dict = {}
        self._per_step = False          # ``per_step_check`` is active
        self._anchor: _Anchor | None = None
        self.ladder_checks = 0          # full ladders run (the reused calls are not counted)
        retain_freed_memory()

    def params(self) -> dict:
        return {"engine": "laplace", "level": self.level, "coarse": COARSE, "tol": self.tol,
                "rungs": [self.level * COARSE ** (1 - j) for j in range(LADDER_RUNGS)],
                "rules": "trapezoid in u = log t and whitened scores; Gauss-Legendre (elementwise)"}

    def applies(self, task: Task, act: Activation, H: int) -> bool:
        return applicability(task, act, H)[0]

    def reason(self, task: Task, act: Activation, H: int) -> str:
        """Why the engine does not apply ("" when it does)."""
        return applicability(task, act, H)[1]

    def _patterns(self, task: Task, act: Activation, a: np.ndarray) -> list[CompiledPattern]:
        key = (act.norm, act.is_plain_exp, tuple(float(x) for x in a), task.F, task.L,
               task.delta)
        if key not in self._poly_cache:
            if len(self._poly_cache) > 16:
                self._poly_cache.clear()
            poly = drift_polynomial(act.norm, a, task.F, task.delta)
            self._poly_cache[key] = compile_patterns(poly, task.L, len(a), act.is_plain_exp)
        return self._poly_cache[key]

    def _error_patterns(self, task: Task, act: Activation, a: np.ndarray
                        ) -> list[CompiledPattern]:
        """The patterns of E alone (the ``sq`` slot; other coefficients zeroed): along Fig. 1
        9 of 354, with tables of W atoms only, so E costs ~1/3 of a drift (measured)."""
        key = ("error",) + (act.norm, act.is_plain_exp, tuple(float(x) for x in a), task.F,
                            task.L, task.delta)
        if key not in self._poly_cache:
            sq = Slots(len(a), task.F).sq()
            out = []
            for p in self._patterns(task, act, a):
                if p.coef[sq] != 0:
                    coef = np.zeros_like(p.coef)
                    coef[sq] = p.coef[sq]
                    out.append(CompiledPattern(p.signal, p.noise, coef, p.k))
            self._poly_cache[key] = out
        return self._poly_cache[key]

    def raw(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
            b: np.ndarray, level: float) -> np.ndarray:
        """The flat slot vector (``Slots``) at one resolution."""
        return self.checked(task, act, M, Q, a, b, level)[0]

    def checked(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                a: np.ndarray, b: np.ndarray, level: float,
                pats: list[CompiledPattern] | None = None,
                groups: tuple[ColumnGroup, list[ColumnGroup]] | None = None
                ) -> tuple[np.ndarray, float]:
        """(slot vector, mass defect) at one resolution (of all fields, or of ``pats``);
        ``groups``: the state's ``column_groups``, if already known."""
        if pats is None:
            pats = self._patterns(task, act, np.asarray(a, float))
        with single_thread_blas():
            rest_min = task.L - 1 - max((len(p.noise) for p in pats), default=0)
            eng = _Engine(task, act, np.asarray(M, float), np.asarray(Q, float),
                          np.asarray(a, float), np.asarray(b, float), level, rest_min, groups)
            return eng.bounded(pats)

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        """E[dM], E[dQ_lin], E[dQ_noise], E[da], E[db] and E at (M, Q, a, b), with abs_err per
        field in ``stderr`` (difference to the next coarser resolution).

        Resolution ladder (error control per state): the rungs are level × COARSE^j; the first
        fine run is at level × COARSE (its coarse partner at level × COARSE²), and while the
        largest abs_err is ≥ ``tol`` the next finer rung is computed, the previous fine run
        becoming its coarse partner (at most ``LADDER_RUNGS`` fine runs).  Along Fig. 1 the
        first rung (abs_err 1e−10–5e−9, its actual error ≤ 1e−12 against level 1.5) is
        accepted, at 40 % of the cost of the fixed (1, 0.75) pair."""
        anchor = self._near_anchor(task, act, M, Q, a, b)
        if anchor is not None:
            fine, stderr = self._on_anchor_rung(task, act, M, Q, a, b, None, anchor)
        else:
            fine, stderr, level = self._ladder(task, act, M, Q, a, b, None)
            if self._per_step:
                self._anchor = _Anchor(task, act, _flat_state(M, Q, a, b), level,
                                       {k: float(np.max(v)) for k, v in stderr.items()})
        return DriftMeans(fine["dM"], fine["dQ_lin"], fine["dQ_noise"], fine["da"], fine["db"],
                          float(fine["error"]), stderr)

    def evaluate_error(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                       a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        """(E, abs_err of E) at (M, Q, a, b) from the patterns of E alone, on the same
        resolution ladder as :meth:`evaluate` (it agrees with ``evaluate().error`` within the
        two abs_err; the ODE records E at its dense-output times with it)."""
        pats = self._error_patterns(task, act, np.asarray(a, float))
        anchor = self._near_anchor(task, act, M, Q, a, b)
        if anchor is not None:
            fine, stderr = self._on_anchor_rung(task, act, M, Q, a, b, pats, anchor)
        else:
            fine, stderr, _ = self._ladder(task, act, M, Q, a, b, pats)
        return float(fine["error"]), float(stderr["error"])

    # -- one convergence check per ODE step ----------------------------------------------
    @contextlib.contextmanager
    def per_step_check(self) -> Iterator["LaplaceDrift"]:
        """Within the block, the resolution ladder runs once per ODE step instead of at every
        call (the adaptive integrator calls :meth:`begin_step` before each step).

        The first drift after :meth:`begin_step` runs the full ladder and becomes the step's
        anchor; every later call (drift or E-only) at a state within ``REUSE_SPAN`` of it
        (largest |Δ| over (M, Q, a, b), relative to max(1, the anchor's largest entry))
        computes only the rung the anchor accepted — the same fields, bit for bit, that the
        ladder returns when it accepts that rung — and reports as each field's abs_err the
        anchor's largest abs_err of that field, floored by its own mass defect (``floored``).
        A state farther away runs the ladder again and becomes the anchor.  Measured along
        the Fig. 1 curve (82 reused states, up to 0.24 away without the guard): the actual
        error of every entry (against ``LaplaceDrift(level=2)``) is ≤ 0.064 of the abs_err
        reported this way (≤ 0.55 of each state's own per-entry abs_err, ≤ 0.74 of the
        anchor's per-entry one: hence the per-field maximum); ≤ 0.20 at L = 4, 5 and into
        the PSD boundary (README), so the bound stays honest.  A reused call keeps the
        anchor's rung where its own ladder would have climbed (the anchor's abs_err was
        below tol).  A call costs the fine rung only (its coarse partner was ~38 % of a
        drift).  Outside the block (and after it) every call runs its own ladder."""
        self._per_step, self._anchor = True, None
        try:
            yield self
        finally:
            self._per_step, self._anchor = False, None

    def begin_step(self) -> None:
        """A new ODE step: the next drift runs the full ladder (``per_step_check``)."""
        self._anchor = None

    def _near_anchor(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                     a: np.ndarray, b: np.ndarray) -> "_Anchor | None":
        """The step's anchor when the state is within ``REUSE_SPAN`` of it, else None."""
        anchor = self._anchor if self._per_step else None
        if anchor is None or anchor.task is not task or anchor.act is not act:
            return None
        y = _flat_state(M, Q, a, b)
        if y.shape != anchor.y.shape:
            return None
        scale = max(1.0, float(np.max(np.abs(anchor.y))))
        return anchor if float(np.max(np.abs(y - anchor.y))) <= REUSE_SPAN * scale else None

    def _on_anchor_rung(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                        a: np.ndarray, b: np.ndarray, pats: list[CompiledPattern] | None,
                        anchor: "_Anchor") -> tuple[dict, dict]:
        """(fields, abs_err) at the anchor's rung only (``per_step_check``)."""
        M, Q = np.asarray(M, float), np.asarray(Q, float)
        v, defect = self.checked(task, act, M, Q, a, b, anchor.level, pats,
                                 column_groups(task, M, Q))
        fine = self.unpack(task, act, M, Q, v)
        spread = {name: np.full(np.shape(fine[name]), anchor.spread[name]) for name in fine}
        return fine, self.floored(fine, spread, defect)

    def _ladder(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                a: np.ndarray, b: np.ndarray, pats: list[CompiledPattern] | None
                ) -> tuple[dict, dict, float]:
        """(fields, abs_err per field, level) of the first rung whose largest abs_err is
        < ``tol`` (or of the finest rung): see :meth:`evaluate`."""
        M, Q = np.asarray(M, float), np.asarray(Q, float)
        ok, why = applicability(task, act, M.shape[0])
        if not ok:
            raise ValidationError(f"engine: laplace {why}")
        level = self.level * COARSE
        groups = column_groups(task, M, Q)
        self.ladder_checks += 1
        coarse = self.unpack(task, act, M, Q, self.checked(task, act, M, Q, a, b, COARSE * level,
                                                           pats, groups)[0])
        for rung in range(LADDER_RUNGS):
            if rung:
                level /= COARSE
            v_fine, defect = self.checked(task, act, M, Q, a, b, level, pats, groups)
            fine = self.unpack(task, act, M, Q, v_fine)
            stderr = self.abs_err(fine, coarse, defect)
            if max(float(np.max(e)) for e in stderr.values()) < self.tol:
                break
            coarse = fine
        return fine, stderr, level

    @staticmethod
    def abs_err(fine: dict, coarse: dict, defect: float) -> dict:
        """Per field |fine − coarse|, floored by the mass defect relative to the field's size.

        The mass identity E[κ/N + Σ W] = 1 catches what refining cannot (a u range that misses
        a head), and 64 ε covers the rounding of ~10³ pattern sums."""
        return LaplaceDrift.floored(
            fine, {name: np.abs(np.asarray(fine[name]) - np.asarray(coarse[name]))
                   for name in fine}, defect)

    @staticmethod
    def floored(fine: dict, spread: dict, defect: float) -> dict:
        """Per field max(spread, max(64 ε, defect) × max(1, |field|)) (``abs_err``)."""
        floor = max(64 * np.finfo(float).eps, defect)
        return {name: np.maximum(spread[name],
                                 floor * np.maximum(1.0, np.abs(np.asarray(fine[name]))))
                for name in fine}

    @staticmethod
    def unpack(task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
               v: np.ndarray) -> dict:
        """Fields from the slot vector: symmetrise dQ, add the Bayes-offset terms."""
        H, F = M.shape
        sl = Slots(H, F)
        dM = v[:H * F].reshape(H, F).copy()
        half = v[sl.dQ_lin(0, 0):sl.dQ_lin(0, 0) + H * H].reshape(H, H).copy()
        noise = v[sl.dQ_noise(0, 0):sl.dQ_noise(0, 0) + H * H].reshape(H, H)
        noise = np.triu(noise) + np.triu(noise, 1).T
        da = v[sl.da(0):sl.da(0) + H].copy()
        db = v[sl.db(0):sl.db(0) + H].copy()
        if act.offset == "bayes":           # 2ρ_h = −Σ_l g_hl = −db_h
            dM = dM - db[:, None] * M
            half = half - db[:, None] * Q
        return {"dM": dM, "dQ_lin": half + half.T, "dQ_noise": noise, "da": da, "db": db,
                "error": task.delta + float(v[sl.sq()])}
