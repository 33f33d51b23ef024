"""E and its exact gradient at any H for per-head activations, from 1- and 2-head sub-models.

For a per-head activation (docs/theory.md §3, N_h = κ + Σ_l φ(t_hl)) head h's weights W_h
depend on its own scores only, and ŷ = Σ_h a_h W_h · c.  Averaging over the values c
(docs/theory.md §4),

    E = Δ + 1 − 2 Σ_h a_h E[W_h0] + Σ_{h,h'} a_h a_h' E[W_h · W_h'],

a sum of terms that involve one head or two.  Let E_1(h) be the error of the one-head model
(M_h, Q_hh, a_h, b_h) and E_2(h, h') that of the two-head model made of heads h and h'
(rows h, h' of M, the 2×2 block of Q, the entries of a and b).  Counting how often each
one-head and each cross term appears,

    E = Σ_{h<h'} E_2(h, h') − (H − 2) Σ_h E_1(h) + c_H (1 + Δ),
    c_H = 1 − H(H − 1)/2 + H(H − 2),

(H = 1: E = E_1; H = 2: E = E_2).  The same holds for every derivative of E, so the gradient
is the same combination of the sub-models' gradients.  The sub-models have H ≤ 2, where the
deterministic Laplace engine (``expect.laplace.LaplaceDrift``, per-head H ≤ 2, any L) gives
the gradient-flow drift fields to ~1e-8 with an error estimate: 28 pairs and 8 singles at H = 8.

**The gradient in key coordinates.**  The solver parametrises the keys as K = [M | P] ∈
R^{H×(F+H)}, Q = K Kᵀ (``objectives.SampledError``).  With G_l the token in that space,
∂E/∂K_h = −2 V_h − 4 E[ρ_h] K_h, V_h = E[Σ_l g_hl G_l].  The Laplace engine's dM field is
exactly this (its ρ term included) along the feature directions u_f, and nothing along other
directions.  So each sub-model is handed to it with *extended features*: its heads' orthogonal
parts P_h span (at most) 2 dimensions, an orthonormal basis B of that span is appended to the
features (prior atoms padded with zeros: no signal there), the sub-model's keys become
M_ext = [M_pair | P_pair B] with Q = M_ext M_extᵀ, and its dM field is V in the coordinates
(u_1 … u_F, B).  Components of V orthogonal to span(U, B) vanish (token noise there is
independent of every score).  No inversion of Q − M Mᵀ is needed, so P → 0 is harmless.

Applies to per-head activations without Bayes offsets, discrete priors (Laplace's own limits:
at most ``montecarlo.MAX_ENUMERATED_ATOMS`` atoms, L ≤ 64, smooth φ > 0).

**Errors.**  :func:`fields` at one fixed resolution ``level`` is a smooth deterministic function
of (K, a, b) (the resolution ladder of ``LaplaceDrift.evaluate`` can change its rung between
neighbouring points, which finite differences must not see).  :func:`evaluate` adds the
error estimate: the same at ``level`` × ``laplace.COARSE``, abs_err = |fine − coarse| floored
as ``LaplaceDrift.abs_err`` does, finer levels until below ``tol``; the abs_err of the
combination is Σ |coefficient| × abs_err of the parts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ..model.activations import Activation
from ..model.priors import make_prior
from ..model.task import Task
from ..model.validation import ValidationError
from . import laplace as lp
from .laplace.algebra import CompiledPattern, Slots, compile_patterns, drift_polynomial

# Fixed resolutions tried by ``evaluate``, coarsest first.  Measured at softmax F = 4, ν = 10,
# L = 5, H = 8, |k| ≈ 3 (one E + gradient against level 1; load 7): level 0.75 11.0 CPU s,
# |ΔE| 9e-16, max |Δ∇E| 7e-16; 0.5625 5.5 s, 4e-15, 6e-14; 0.5 4.1 s, 6e-13, 5e-12;
# 0.42 2.5 s, 1e-10, 1.2e-9.  So 0.5625 (checked against 0.42) meets the 1e-8 of the
# certificate at half the cost of 0.75, and finer rungs follow where it does not.
LEVELS = (0.5625, 0.75, 1.0, 4.0 / 3.0)
DEFAULT_LEVEL = LEVELS[0]
DESCENT_LEVEL = 0.5                # the polish's L-BFGS far from the minimum (gradient_flow)
DEFAULT_TOL = 1e-8
PARTS = ("E", "dK", "da", "db")    # what one sub-model gives, in ``sub_model``'s order


def c_H(H: int) -> int:
    """The constant of the decomposition: 1 − H(H−1)/2 + H(H−2)."""
    return 1 - H * (H - 1) // 2 + H * (H - 2)


def applicability(task: Task, act: Activation, H: int) -> tuple[bool, str]:
    """(True, "") when the decomposition and the Laplace engine cover (task, act, H)."""
    if act.norm != "per-head":
        return False, f"needs a per-head normalisation (got '{act.norm}')"
    if act.offset == "bayes":
        return False, "Bayes offsets couple a head's weights to its norm only, but are not handled"
    if not task.prior.is_discrete:
        return False, f"needs a discrete prior (got '{task.prior.name}')"
    return lp.applicability(_extended_task(task, 2), act, min(H, 2))


def check_applies(task: Task, act: Activation, H: int) -> None:
    ok, why = applicability(task, act, H)
    if not ok:
        raise ValidationError(f"engine: pairwise Laplace {why}")


@lru_cache(maxsize=64)
def _extended_task_cached(L: int, delta: float, atoms: bytes, shape: tuple, weights: bytes,
                          extra: int) -> Task:
    A = np.frombuffer(atoms).reshape(shape)
    w = np.frombuffer(weights)
    return Task(L, make_prior("discrete", atoms=np.hstack([A, np.zeros((len(A), extra))]),
                              weights=w), delta)


def _extended_task(task: Task, extra: int) -> Task:
    """The task with ``extra`` signal-free features appended (atoms padded with zeros)."""
    A, w = task.prior.atoms()
    A, w = np.ascontiguousarray(A, float), np.ascontiguousarray(w, float)
    return _extended_task_cached(task.L, float(task.delta), A.tobytes(), A.shape, w.tobytes(),
                                 extra)


@dataclass(frozen=True)
class Fields:
    """E and its gradient ∂E/∂K (H × (F+H)), ∂E/∂a, ∂E/∂b; with ``evaluate``, their abs_err."""

    value: float
    dK: np.ndarray
    da: np.ndarray
    db: np.ndarray
    value_err: float = 0.0
    grad_err: float = 0.0       # ‖abs_err of the counted parts of (dK, da, db)‖₂ (``evaluate``)
    level: float = DEFAULT_LEVEL
    evaluations: int = 0

    def grad(self) -> np.ndarray:
        return np.concatenate([self.dK.ravel(), self.da, self.db])


class PairwiseLaplace:
    """The decomposition of the module docstring on ``laplace.LaplaceDrift`` (public methods
    ``checked``, ``unpack``, ``abs_err``), with the gradient-flow patterns only (the γ² field
    dQ_noise dropped: ~half of the patterns, ~2x less CPU per sub-model, measured)."""

    def __init__(self, task: Task, act: Activation, H: int) -> None:
        check_applies(task, act, H)
        self.task, self.act, self.H = task, act, H
        self.engine = lp.LaplaceDrift()
        self._pats: dict = {}
        self.evaluations = 0            # sub-model evaluations (one resolution each)

    # ------------------------------------------------------------------ one sub-model
    def _patterns(self, task: Task, a: np.ndarray) -> list:
        """The Laplace patterns of every field but dQ_noise, for this sub-model's a."""
        key = (task.prior.F, tuple(float(x) for x in a))
        if key not in self._pats:
            n = len(a)
            slots = Slots(n, task.prior.F)
            keep = np.ones(slots.size, bool)
            keep[slots.dQ_noise(0, 0):slots.dQ_noise(0, 0) + n * n] = False
            poly = drift_polynomial(self.act.norm, a, task.prior.F, task.delta)
            out = []
            for p in compile_patterns(poly, task.L, n, self.act.is_plain_exp):
                coef = np.where(keep, p.coef, 0.0)
                if np.any(coef):
                    out.append(CompiledPattern(p.signal, p.noise, coef, p.k))
            self._pats[key] = out
        return self._pats[key]

    def sub_model(self, K: np.ndarray, a: np.ndarray, b: np.ndarray, heads: tuple[int, ...],
                  level: float) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, float, dict]:
        """(E, ∂E/∂K_heads (n × (F+H)), ∂E/∂a_heads, ∂E/∂b_heads, mass defect, raw fields) of
        the sub-model of ``heads`` at one resolution, through extended features (docstring)."""
        F = self.task.F
        idx = list(heads)
        P = K[idx, F:]                               # (n, H) orthogonal parts
        basis, r = np.linalg.qr(P.T)                 # P.T = basis r, basis (H, n)
        ext = _extended_task(self.task, len(idx))
        M_ext = np.hstack([K[idx, :F], r.T])         # (n, F + n): P = r.T basisᵀ
        Q = M_ext @ M_ext.T
        ai, bi = np.asarray(a, float)[idx], np.asarray(b, float)[idx]
        v, defect = self.engine.checked(ext, self.act, M_ext, Q, ai, bi, level,
                                        self._patterns(ext, ai))
        self.evaluations += 1
        fld = lp.LaplaceDrift.unpack(ext, self.act, M_ext, Q, v)
        V = fld["dM"]                                # (n, F + n) = E[Σ_l g G_l] incl. ρ
        dK = -2.0 * np.hstack([V[:, :F], V[:, F:] @ basis.T])
        return float(fld["error"]), dK, -2.0 * fld["da"], -2.0 * fld["db"], defect, fld

    # ------------------------------------------------------------------ the combination
    def constant(self) -> float:
        """c_H (1 + Δ), the decomposition's constant (0 at H ≤ 2, where it is one term)."""
        return c_H(self.H) * (1.0 + self.task.delta)

    def terms(self, heads: list[int] | None = None) -> list[tuple[tuple[int, ...], float]]:
        """(sub-model heads, coefficient) of the decomposition; with ``heads``, only the terms
        that involve one of them (what a finite difference along those heads changes)."""
        H = self.H
        if H <= 2:
            out = [(tuple(range(H)), 1.0)]
        else:
            out = [(p, 1.0) for p in itertools.combinations(range(H), 2)]
            out += [((h,), -(H - 2.0)) for h in range(H)]
        if heads is not None:
            out = [(t, c) for t, c in out if set(t) & set(heads)]
        return out

    def fields(self, K: np.ndarray, a: np.ndarray, b: np.ndarray, level: float = DEFAULT_LEVEL,
               heads: list[int] | None = None) -> Fields:
        """E and its gradient at one resolution (smooth in K, a, b); with ``heads``, only the
        terms involving them (and no constant): a partial sum for finite differences."""
        H = self.H
        dK, da, db = np.zeros_like(K, dtype=float), np.zeros(H), np.zeros(H)
        value = 0.0 if heads is not None else self.constant()
        for sub, coef in self.terms(heads):
            e, gK, ga, gb, _, _ = self.sub_model(K, a, b, sub, level)
            idx = list(sub)
            value += coef * e
            dK[idx] += coef * gK
            da[idx] += coef * ga
            db[idx] += coef * gb
        return Fields(value, dK, da, db, level=level)

    def evaluate(self, K: np.ndarray, a: np.ndarray, b: np.ndarray,
                 tol: float = DEFAULT_TOL, counted: Callable | None = None) -> Fields:
        """E and its gradient with abs_err: each sub-model at ``LEVELS[j]`` against
        ``LEVELS[j]`` × COARSE, the first j where both the abs_err of E and ``grad_err`` are
        below ``tol``, else the finest.  abs_err of the sum: Σ |coef| × the part's (|fine −
        coarse| floored by its mass defect, ``LaplaceDrift.abs_err``).  ``grad_err`` =
        ‖counted(err dK, err da, err db)‖₂: ``counted`` picks the coordinates a caller
        certifies (its trained ones; default all), so that the rung stopped at resolves the
        very norm the certificate compares with ``tol``.  Why not the largest entry, as
        before: 40 entries each below 1e-8 made a norm of 1.25e-8, and a minimum (softmax-1,
        F = 4, ν = 10, H = 4, level 0.75) was reported "gradient unresolved" that level 1.0
        resolves to 4e-11."""
        H = self.H
        start = self.evaluations
        for level in LEVELS:
            value = self.constant()
            grads = [np.zeros_like(K, dtype=float), np.zeros(H), np.zeros(H)]
            errs = [np.zeros_like(K, dtype=float), np.zeros(H), np.zeros(H)]
            value_err = 0.0
            for sub, coef in self.terms():
                fine = self.sub_model(K, a, b, sub, level)
                coarse = self.sub_model(K, a, b, sub, level * lp.COARSE)
                idx = list(sub)
                err = lp.LaplaceDrift.abs_err(dict(zip(PARTS, fine[:4])),
                                              dict(zip(PARTS, coarse[:4])), fine[4])
                value += coef * fine[0]
                value_err += abs(coef) * float(err["E"])
                fine_grads = fine[1:4]           # ∂E/∂K, ∂E/∂a, ∂E/∂b (arrays)
                for j, name in enumerate(PARTS[1:]):
                    grads[j][idx] += coef * fine_grads[j]
                    errs[j][idx] += abs(coef) * err[name]
            grad_err = float(np.linalg.norm(counted(*errs) if counted else
                                            np.concatenate([e.ravel() for e in errs])))
            if max(value_err, grad_err) < tol:
                break
        return Fields(float(value), grads[0], grads[1], grads[2], float(value_err), grad_err,
                      level, self.evaluations - start)

    def error(self, K: np.ndarray, a: np.ndarray, b: np.ndarray,
              tol: float = DEFAULT_TOL) -> tuple[float, float]:
        """(E, abs_err) only, from ``LaplaceDrift.evaluate_error`` per sub-model (its own
        resolution ladder; the E-only patterns cost ~1/3 of the fields)."""
        F = self.task.F
        value = self.constant()
        err = 0.0
        for sub, coef in self.terms():
            idx = list(sub)
            M, Q = K[idx, :F], K[idx] @ K[idx].T
            e, de = self.engine.evaluate_error(self.task, self.act, M, Q,
                                               np.asarray(a, float)[idx],
                                               np.asarray(b, float)[idx])
            self.evaluations += 1
            value += coef * e
            err += abs(coef) * de
        return float(value), float(err)
