"""The engine at one resolution for one state: its score nodes and u grids (step 5 of the
``laplace`` package), with its one-token tables (``tables``), pattern sums (``sums``) and
bounded memory (``memory``) mixed in.

:class:`_Engine` builds, for a state (M, Q, a, b) and a resolution ``level`` (every step
∝ 1/level), the nodes of each score column (``columns``) and the u grids of the normalisers;
``ladder`` then asks it for the slot vector of a pattern list (:meth:`_Engine.bounded`).

Notes
-----
5. **Rules.**  u: the trapezoid grid of ``quadrature.u_grid`` over the whole ψ span, with its
   top cut where the ≥ L − 1 − n_max plain noise tokens of every pattern make it < 1e−20
   (``_cut_top``) and 4× wider steps in the lower tail through an analytic change of
   variable (``_stretch_low``); together with flushing subnormal kernel values to 0 this made
   the Fig. 1 drifts 10–15× cheaper at unchanged values (≤ 1.3e−14).  Gaussian columns: trapezoid in
   whitened variables (only the range of the covariance, so singular Q and M = Q = 0 work);
   per-head H = 2 uses nested conditioning s_1 = μ_1 + σ_1 z_1, s_2 = μ_2 + β z_1 + σ_c z_2 so
   that a 2-D (u_1, u_2) table is one matrix product over z_1.  Elementwise φ (which may have
   kinks) uses composite Gauss–Legendre with the kinks as panel edges, nested for two heads.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from ...model.activations import Activation
from ...model.task import Task
from ...model.validation import ValidationError
from ..quadrature import (
    MAX_PSI_SPAN,
    UGrid,
    gaussian_nodes,
    kinks,
    largest_psi,
    log_phi,
    piecewise_gauss_legendre_normal,
    tensor_cost,
    tensor_rules,
    trapezoid_normal,
    u_grid,
    whiten,
)
from .columns import (
    ColumnGroup,
    _NodeColumn,
    column_groups,
    merged_column,
    nested_factors,
)
from .memory import NODE_ARRAYS, _BoundedMemory
from .sums import _PatternSums
from .tables import X_CLIP, _Tables
from .zeros import touches_zero, zero_resolution

# Resolution at level 1.  Measured on softmax H = 2, L = 10: the error at level 0.75 is
# ~1e−13–2e−11, but it grows erratically to ~1e−7 when the steps are a further 1.33× coarser
# (factors (tφ)^k with k up to 6 narrow the strip of analyticity; along Fig. 1 level 0.5625 is
# off by 2e−10–5e−9), so the ladder's first rung (0.75 against 0.5625) is kept only where
# that measured difference is < tol, and no rung is coarser.
U_STEP = 0.3                     # trapezoid step in u = log t
U_LOW = 32.0                     # lower u margin: the cut tail is ≤ e^{−32} ≈ 1e−14
Z_LEVEL = 1.25                   # whitened-score step 0.24/σ (``trapezoid_normal``)
GL_LEVEL = 1.6                   # Gauss–Legendre order 16 per panel
                                 # (elementwise fields reach O(10–100))
JOINT3_Z = 0.64                  # joint H = 3: 3-D grid, step 0.375/σ
                                 # (coarse-run error ~5e−10, measured)
LOG_PATTERN_BOUND = 80.0         # log of a bound on a pattern's factors other than plain tokens
STRETCH = 3.0                    # lower u tail: steps 1 + STRETCH times wider (``_stretch_low``)
STRETCH_GAP = 6.0                # ... below u = −ψ_max − STRETCH_GAP, where tφ ≤ e^{−6}
STRETCH_WIDTH = 1.0              # ... with a transition of this width in u
GAUSS_TAIL = 2e-17                # P(|z| > 8.5): the score mass the trapezoid does not see
U_TOP_CUT = 46.0                 # the cut top of the u integral is ≤ e^{−46} ≈ 1e−20 per pattern


class _Engine(_Tables, _PatternSums, _BoundedMemory):
    """Tables and pattern sums at one resolution for one state (``algebra``, step 3): the
    score nodes and u grids here, the tables, sums and bounded evaluation from the mixins."""

    def __init__(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray, level: float, rest_min: int = 0,
                 groups: tuple[ColumnGroup, list[ColumnGroup]] | None = None) -> None:
        self.task, self.act, self.level = task, act, level
        # the score rules' resolution: × zero_resolution(act) where φ touches zero (the peak
        # of e^{−tφ} at the zero narrows as t grows), exactly ``level`` otherwise
        self.z_level = level * zero_resolution(act)
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
        z_level = Z_LEVEL * (JOINT3_Z if H == 3 else 1.0) * self.z_level
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
        z1, w1 = trapezoid_normal(s1, Z_LEVEL * self.z_level)
        z2, w2 = trapezoid_normal(sc, Z_LEVEL * self.z_level)
        self._check_memory(8.0 * NODE_ARRAYS * len(z1) * len(z2), " for its score nodes")
        s: list[Any] = [None, None]          # per head, both filled below
        s[first] = (group.mean[first] + s1 * z1)[:, None]
        s[second] = group.mean[second] + beta * z1[:, None] + sc * z2[None, :]
        col = _NodeColumn(self.act, self.c, group, s, np.outer(w1, w2))
        col.first, col.w1, col.w2 = first, w1, w2
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
        s: list[Any] = [None, None]          # per head, both filled below
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
        ug = self._cut_top(self._stretch_low(ug, largest_psi(hi, self.act.kappa)), heads)
        if self.act.kappa > 0 and touches_zero(self.act):
            # a score node near a zero of φ has ψ ≪ 0 and stretches the grid to u ≈ −ψ_min
            # (to 78 for a node at 1e−17), but e^{−κt} has zeroed the weights from
            # u ≈ log(745/κ) on: cut there (3–4× fewer u points per head at H = 2).  Only for
            # this class: elsewhere the trailing zeros stay, so the sums keep their last bits
            end = int(np.nonzero(ug.w > 0)[0][-1]) + 2 if np.any(ug.w > 0) else len(ug.u)
            ug = UGrid(ug.u[:end], ug.w[:end])
        return ug

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
            z, w = trapezoid_normal(sd, Z_LEVEL * self.z_level)
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
