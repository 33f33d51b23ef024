"""High-precision (mpmath, ≥ 30 digits by default) reference values for small cases.

These evaluate the same Laplace-reduced integrals as ``expect.quadrature`` (see its
docstring), but every integral is an adaptive ``mpmath.quad`` (tanh–sinh) at ``dps``
digits, nested.  That keeps them cheap only when each column is at most one Gaussian
direction, so they cover:

* elementwise activations with H = 1 (split at the kinks of φ);
* normalised activations whose column covariances have rank ≤ 1 (H = 1, or heads that are
  multiples of one direction; e.g. the Bayes-softmax of a one-feature discrete prior);
* per-head normalisation with several heads when the heads are independent given θ
  (every column covariance diagonal), where E[W_hl W_gl | θ] = E[W_hl | θ] E[W_gl | θ];
* the Bayes error of a discrete prior of rank ≤ 1 and of a one-feature Gaussian prior.

``softmax_pair_error`` is an independent direct check: one softmax head with L = 2 has
w_0 = 1/(1 + e^{δ}) with δ = s_1 − s_0 ~ N(−Mθ, Q + Q_sig), a single 1-D integral.
"""
from __future__ import annotations

from typing import Callable

import mpmath as mp
import numpy as np
import sympy as sp
from mpmath.calculus.quadrature import GaussLegendre

from ..model.activations import S_SYMBOL, Activation
from ..model.priors import DiscretePrior, GaussianPrior
from ..model.state import State
from ..model.task import Task
from ..model.validation import ValidationError
from .quadrature import Column, Overlaps, kinks, signal_columns, whiten

DEFAULT_DPS = 30

MPMATH_NAMESPACE = {"Sigmoid": lambda x: 1 / (1 + mp.exp(-x)),
                    "Softplus": lambda x: mp.log(1 + mp.exp(x)),
                    "Heaviside": lambda x, *args: mp.mpf(1) if x > 0 else (
                        mp.mpf(0) if x < 0 else mp.mpf(0.5)),
                    "Max": lambda *a: max(a), "Min": lambda *a: min(a)}


def _lambdify_mp(expr: sp.Expr) -> Callable:
    return sp.lambdify(S_SYMBOL, expr, modules=[MPMATH_NAMESPACE, "mpmath"])


def _log_phi_mp(act: Activation) -> Callable:
    if act.log_psi is not None:
        return _lambdify_mp(act.log_psi)
    phi = _lambdify_mp(act.phi)
    return lambda s: mp.log(phi(s)) if phi(s) > 0 else mp.ninf


Z_MP = 13      # |z| ≤ 13 holds all but 5e−39 of the normal mass
X_ZERO = 90    # e^{−e^x} < 1e−5e38 for x > 90: exactly 0 at any working precision we use
U_MARGIN = 45  # lower u tail: integrands < e^{u + ψ_max} < e^{−45}


def _normal_expect(f: Callable, points: list | None = None) -> mp.mpf:
    """E f(z), z ~ N(0, 1), by tanh–sinh on [−13, 13] split at 0 and ``points``.

    Finite ends keep the tanh–sinh nodes away from |z| ~ 1e30, where e^{σz} is ruinous."""
    inside = [mp.mpf(p) for p in (points or []) if -Z_MP < p < Z_MP]
    pts = sorted(set([mp.mpf(-Z_MP), mp.mpf(0), mp.mpf(Z_MP)] + inside))
    dens = 1 / mp.sqrt(2 * mp.pi)
    return mp.quad(lambda z: f(z) * dens * mp.exp(-z * z / 2), pts)


def _emex(x: mp.mpf) -> mp.mpf:
    """e^{−e^x}, exactly 0 beyond x = 90 (avoids computing e^{e^x} for huge x)."""
    return mp.mpf(0) if x > X_ZERO else mp.exp(-mp.exp(x))


# ----------------------------------------------------------------------------- normalised
class _RankOneColumn:
    """ψ_h(z) = log φ(μ_h + A_h z + c_h) for a column of rank ≤ 1, and its (B, A, C)(u)."""

    def __init__(self, act: Activation, col: Column, heads: list[int], c: np.ndarray,
                 a: np.ndarray, degree: int = 3) -> None:
        cov = col.cov[np.ix_(heads, heads)]
        load = whiten(cov)
        if load.shape[1] > 1:
            raise ValidationError("method: 'mpmath' needs every score column to have rank <= 1 "
                                  "for this activation (use quad)")
        self.load = [mp.mpf(float(x))
                     for x in (load[:, 0] if load.shape[1] else np.zeros(len(heads)))]
        self.shift = [mp.mpf(float(col.mean[h] + c[h])) for h in heads]
        self.a = [mp.mpf(float(x)) for x in a]
        self.log_phi = _log_phi_mp(act)
        self.weight = mp.mpf(col.weight)
        self.random = any(x != 0 for x in self.load)
        self._cache: dict = {}
        self._nodes: list | None = None
        self.degree = degree

    def psi(self, z: mp.mpf) -> list:
        return [self.log_phi(m + l * z) for m, l in zip(self.shift, self.load)]

    @property
    def nodes(self) -> list:
        """[(weight, ψ(z))] of a fixed composite Gauss–Legendre rule for E over z ~ N(0,1):
        panels of width min(1, 1/σ) on [−13, 13], 3·2^(degree−1) nodes each (mpmath's
        nodes).  For φ = exp the integrands are analytic in |Im z| < π/(2σ), so each panel's
        error is below ρ^{−24}, ρ ≥ 3.4, at degree 3."""
        if self._nodes is None:
            if not self.random:
                self._nodes = [(mp.mpf(1), self.psi(mp.mpf(0)))]
            else:
                rule = GaussLegendre(mp.mp)
                dens = 1 / mp.sqrt(2 * mp.pi)
                sigma = max(abs(float(x)) for x in self.load)
                edges = _panel_edges(-Z_MP, Z_MP, min(1.0, 1.0 / sigma))
                self._nodes = [(w * dens * mp.exp(-x * x / 2), self.psi(x))
                               for a, b in zip(edges[:-1], edges[1:])
                               for x, w in rule.get_nodes(a, b, self.degree, mp.mp.prec)]
        return self._nodes

    def functions(self, u: mp.mpf) -> tuple:
        """(B, A, C)(u): E e^{−Σe^x}, E Σa e^x e^{−Σe^x}, E (Σa e^x)² e^{−Σe^x}, x = u + ψ."""
        if u in self._cache:
            return self._cache[u]
        B = A = C = mp.mpf(0)
        for w, psi in self.nodes:
            xs = [u + p for p in psi]
            if max(xs) > X_ZERO:
                continue
            ex = [mp.exp(x) for x in xs]
            lin = mp.fsum(a * e for a, e in zip(self.a, ex))
            damp = w * mp.exp(-mp.fsum(ex))
            B += damp
            A += lin * damp
            C += lin * lin * damp
        self._cache[u] = (B, A, C)
        return B, A, C

    def psi_range(self) -> tuple[float, float]:
        vals = [float(p) for z in np.linspace(-Z_MP, Z_MP, 53) for p in self.psi(mp.mpf(z))
                if p != mp.ninf]
        return min(vals), max(vals)


def _panel_edges(lo: float, hi: float, width: float) -> list:
    n = max(1, int(np.ceil((hi - lo) / width)))
    return [mp.mpf(lo) + (mp.mpf(hi) - mp.mpf(lo)) * k / n for k in range(n + 1)]


def _u_nodes(cols: list[_RankOneColumn], degree: int, kappa: float = 0.0) -> list:
    """[(u, weight)] of composite Gauss–Legendre on [−ψ_max − 45, −ψ_min + 6], panels 3/2 wide.

    Below the range the integrands are < e^{u + ψ_max} < e^{−45}; above it they are
    < exp(−e^6) (ψ over |z| ≤ 13).  They are analytic in |Im u| < π/2.

    The whole range is needed: 1/Z = ∫ e^u e^{−Z e^u} du puts a draw's weight at u ≈ −log Z,
    and log Z runs over [ψ_min, ψ_max + log L].  (An earlier cut at ψ_max − 200 dropped the
    typical draws of a one-feature Gaussian prior with ν = 6, where ψ = β s² reaches 500 at
    |z| = 13, and returned E_Bayes = 1 with an error of 1e−15.)  With κ > 0 the factor
    e^{−κ e^u} < exp(−e^6) ends the range at −log κ + 6 as well."""
    lo = min(c.psi_range()[0] for c in cols)
    hi = max(c.psi_range()[1] for c in cols)
    top = -lo + 6 if kappa <= 0 else min(-lo + 6, -float(np.log(kappa)) + 6)
    rule = GaussLegendre(mp.mp)
    edges = _panel_edges(-hi - U_MARGIN, max(top, -hi - U_MARGIN + 1.5), 1.5)
    return [(x, w) for a, b in zip(edges[:-1], edges[1:])
            for x, w in rule.get_nodes(a, b, degree, mp.mp.prec)]


def _joint_moments(task: Task, act: Activation, state: Overlaps, heads: list[int],
                   a: np.ndarray, c: np.ndarray, degree: int = 3
                   ) -> tuple[mp.mpf, mp.mpf, mp.mpf]:
    """(E[w_0], E[Σ_l w_l²], E[w_1]) for ``heads`` jointly normalised, at mp precision.

    Both the u-integral and the Gaussian averages use fixed composite Gauss–Legendre rules
    with mpmath's nodes (``degree``: 3·2^(degree−1) nodes a panel)."""
    L, kappa = task.L, mp.mpf(act.kappa)
    noise = _RankOneColumn(act, Column(1.0, np.zeros(state.H), state.Q), heads, c, a, degree)
    sigs = [_RankOneColumn(act, col, heads, c, a, degree) for col in signal_columns(task, state)]
    unodes = _u_nodes(sigs + [noise], degree, act.kappa)
    w0 = w2 = w1 = mp.mpf(0)
    for sig in sigs:
        s0 = s1 = s2 = mp.mpf(0)
        for u, wu in unodes:
            damp = wu * mp.exp(-kappa * mp.exp(u))
            Bs, As, Cs = sig.functions(u)
            Bn, An, Cn = noise.functions(u)
            s0 += damp * As * Bn ** (L - 1)
            s1 += damp * An * Bs * Bn ** (L - 2)
            s2 += damp * (Cs * Bn ** (L - 1) + (L - 1) * Cn * Bs * Bn ** (L - 2))
        w0 += sig.weight * s0
        w1 += sig.weight * s1
        w2 += sig.weight * s2
    return w0, w2, w1


def _per_head_conditional(task: Task, act: Activation, state: State, h: int,
                          c: np.ndarray) -> tuple[list, list, mp.mpf]:
    """Per atom: E[W_h0 | θ], E[W_h1 | θ] and the θ-averaged E[Σ_l W_hl²]."""
    e0, e1 = [], []
    e2 = mp.mpf(0)
    for col in signal_columns(task, state):
        sub = _single_column_task(task, col)
        w0, w2, w1 = _joint_moments(sub[0], act, sub[1], [h], np.ones(1), c)
        e0.append(w0)
        e1.append(w1)
        e2 += mp.mpf(col.weight) * w2
    return e0, e1, e2


def _single_column_task(task: Task, col: Column) -> tuple[Task, _ColumnState]:
    """A task/state pair whose only signal column is ``col`` (a one-atom prior)."""
    # one atom θ = 1 and M = mean, so that Mθ = mean; the covariance is Q (discrete priors)
    H = len(col.mean)
    prior = DiscretePrior(np.ones((1, 1)), np.ones(1))
    return Task(task.L, prior, task.delta), _ColumnState(col.mean[:, None], col.cov, H)


class _ColumnState:
    """Duck-typed State for one explicit column (mean, covariance); skips PSD coupling checks."""

    def __init__(self, M: np.ndarray, Q: np.ndarray, H: int) -> None:
        self.M, self.Q, self.H = M, Q, H


def normalised_error(task: Task, act: Activation, state: State,
                     dps: int = DEFAULT_DPS) -> mp.mpf:
    """E for a normalised activation at ``dps`` digits (rank-≤1 or independent heads)."""
    c = np.asarray(state.b, dtype=float) + act.offsets(np.diag(state.Q))
    a = np.asarray(state.a, dtype=float)
    with mp.workdps(dps):
        if act.norm == "joint" or state.H == 1:
            w0, w2, _ = _joint_moments(task, act, state, list(range(state.H)), a, c)
            return mp.mpf(task.delta) + 1 - 2 * w0 + w2
        if isinstance(task.prior, GaussianPrior):
            raise ValidationError("method: 'mpmath' for per-head heads > 1 needs a discrete prior")
        off = state.Q - np.diag(np.diag(state.Q))
        if np.any(off != 0):
            raise ValidationError("method: 'mpmath' for per-head activations with H > 1 needs "
                                  "independent heads (diagonal Q); use quad")
        cols = signal_columns(task, state)
        per = [_per_head_conditional(task, act, state, h, c) for h in range(state.H)]
        L = task.L
        w0 = mp.fsum(mp.mpf(a[h]) * mp.mpf(col.weight) * per[h][0][j]
                     for h in range(state.H) for j, col in enumerate(cols))
        w2 = mp.fsum(mp.mpf(a[h]) ** 2 * per[h][2] for h in range(state.H))
        for h in range(state.H):
            for g in range(h + 1, state.H):
                cross = mp.fsum(mp.mpf(col.weight) * (per[h][0][j] * per[g][0][j]
                                                      + (L - 1) * per[h][1][j] * per[g][1][j])
                                for j, col in enumerate(cols))
                w2 += 2 * mp.mpf(a[h] * a[g]) * cross
        return mp.mpf(task.delta) + 1 - 2 * w0 + w2


# ----------------------------------------------------------------------------- elementwise
def elementwise_error(task: Task, act: Activation, state: State,
                      dps: int = DEFAULT_DPS) -> mp.mpf:
    """E for an elementwise activation with one head: 1-D Gaussian integrals split at kinks."""
    if state.H != 1:
        raise ValidationError("method: 'mpmath' supports elementwise activations with H = 1 only")
    phi = _lambdify_mp(act.phi)
    c = float(state.b[0])
    a = mp.mpf(float(state.a[0]))
    with mp.workdps(dps):
        def moment(col: Column, k: int) -> mp.mpf:
            m, s = mp.mpf(float(col.mean[0]) + c), mp.sqrt(mp.mpf(max(float(col.cov[0, 0]), 0.0)))
            if s == 0:
                return phi(m) ** k
            cuts = [(kk - m) / s for kk in kinks(act)]
            return _normal_expect(lambda z: phi(m + s * z) ** k, cuts)
        noise = Column(1.0, np.zeros(1), state.Q)
        n2 = moment(noise, 2)
        total = mp.mpf(task.delta)
        for col in signal_columns(task, state):
            w0 = a * moment(col, 1)
            w2 = a * a * (moment(col, 2) + (task.L - 1) * n2)
            total += mp.mpf(col.weight) * (1 - 2 * w0 + w2)
        return total


def population_error_mp(task: Task, act: Activation, state: State,
                        dps: int = DEFAULT_DPS) -> mp.mpf:
    """E(M, Q, a, b) at ``dps`` digits for the small cases listed in the module docstring."""
    if act.norm == "elementwise":
        return elementwise_error(task, act, state, dps)
    return normalised_error(task, act, state, dps)


# ----------------------------------------------------------------------------- direct checks
def softmax_pair_error(task: Task, state: State, a: float = 1.0,
                       dps: int = DEFAULT_DPS) -> mp.mpf:
    """One softmax head (κ = 0), L = 2: E = Δ + E[(1 − a W_0)² + a² (1 − W_0)²] with
    W_0 = 1/(1 + e^δ), δ = s_1 − s_0 ~ N(−Mθ, Q + Q_sig); a 1-D integral per atom."""
    if state.H != 1 or task.L != 2:
        raise ValidationError("H: softmax_pair_error needs H = 1 and L = 2")
    a = mp.mpf(a)
    with mp.workdps(dps):
        total = mp.mpf(task.delta)
        for col in signal_columns(task, state):
            m = -mp.mpf(float(col.mean[0]))
            s = mp.sqrt(mp.mpf(float(col.cov[0, 0] + state.Q[0, 0])))

            def sq(z: mp.mpf) -> mp.mpf:
                W0 = 1 / (1 + mp.exp(m + s * z))
                return (1 - a * W0) ** 2 + a * a * (1 - W0) ** 2
            total += mp.mpf(col.weight) * (_normal_expect(sq) if s > 0 else sq(mp.mpf(0)))
        return total


# ----------------------------------------------------------------------------- Bayes error
def bayes_error_mp(task: Task, dps: int = DEFAULT_DPS) -> tuple[mp.mpf, mp.mpf]:
    """(E_Bayes from E[Σ p²], E_Bayes from E[p_0]) at ``dps`` digits.

    Discrete priors of rank ≤ 1 (B-softmax at the atoms), or a Gaussian prior with F = 1,
    where p_l ∝ exp(β p_l²), β = ν/(2(1+ν)), and the signal projection is N(0, 1 + ν)."""
    from .quadrature import bayes_setup
    state: Overlaps
    with mp.workdps(dps):
        if isinstance(task.prior, GaussianPrior):
            if task.F != 1:
                raise ValidationError("method: 'mpmath' Bayes error with a Gaussian prior "
                                      "needs F = 1")
            nu = float(task.prior.nu[0])
            beta = mp.mpf(nu) / (2 * (1 + mp.mpf(nu)))
            act = _quadratic_log_phi(beta)
            # through the projection p = u_1 · x: "M" = 1, "Q" = 1, signal N(0, 1 + ν)
            state = _ColumnState(np.ones((1, 1)), np.ones((1, 1)), 1)
            w0, w2, _ = _joint_moments(task, act, state, [0], np.ones(1), np.zeros(1))
        else:
            act, state = bayes_setup(task)
            c = act.offsets(np.diag(state.Q))
            w0, w2, _ = _joint_moments(task, act, state, list(range(state.H)),
                                       np.ones(state.H), c)
        base = mp.mpf(task.delta) + 1
        return base - w2, base - w0


def _quadratic_log_phi(beta: mp.mpf) -> Activation:
    expr = sp.exp(sp.Float(str(beta), 40) * S_SYMBOL ** 2)
    return Activation("bayes-gaussian", expr, "joint", 0.0, a_rule="1")

