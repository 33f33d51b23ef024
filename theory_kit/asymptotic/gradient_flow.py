"""Gradient flow's fixed points: local minima of E, solved for on the sampled or the
deterministic E (docs/theory.md §6).

Waiting for the ODE to settle is hopeless near a flat minimum (speeds fall like 1/τ), so E∞
runs integrate only until the state has left the plateau, then *solve*.  In gradient flow
(γ² term dropped, τ = γ t) the keys move by dx/dτ = −½ ∂E/∂x: the fixed points are the
stationary points of E, and the stable ones its local minima.

* **Sampled E** (:func:`solve_gradient_flow`): E is minimised locally on fixed samples
  (``objectives.SampledError``: a smooth deterministic function with its exact gradient, the
  Bayes posterior as control variate so that what is minimised is the excess
  E − E_Bayes = E‖w − p‖²) in the parametrisation K = [M | P] ∈ R^{H×(F+H)}, Q = K Kᵀ (+ a, b
  when trained): L-BFGS to a gradient of 1e-6, then trust-region Newton on its exact
  Hessian-vector products (``trust_newton``) to the certificate's tolerance; the
  classification's Hessian from the same products.
* **Deterministic polish** (gradient flow, per-head activations, discrete priors, any H):
  ``deterministic.PairwiseError`` is E with its exact gradient from the pairwise decomposition
  on the Laplace engine (``expect.pairwise``: no samples, ~1e-8 with an error estimate), and
  :func:`polish_gradient_flow` minimises and certifies on it from the sampled solution (or
  from the hand-over when the sampled descent ran off into a sample artefact).

Both run one loop (:func:`_descend`): L-BFGS; the quotient Hessian Hq = Zᵀ ∇²E Z, classified
(module ``certificate``); at a saddle a step to the lower side along its eigenvector
(:func:`escape`) and a new descent; at a minimum trust-region Newton on the quotient
(:func:`_newton`),

    p = argmin_{‖p‖ ≤ Δ} gᵀp + ½ pᵀ B p,   x ← x + Z p,   g = Zᵀ ∇E,

with B = Hq, BFGS-updated by every trial step.

**Run-offs.**  A descent whose ‖x‖ passes RUNOFF_FACTOR · max(1, ‖x₀‖) (:func:`runoff_bound`)
is stopped (kind "keys diverge", never certified).  :func:`runoff_check` scales the diverged
heads by c along their own directions, K_h → c K_h, and compares E(c) − E(1) on held-out
points: E lower back along the ray (a sample artefact), falling towards the hard-attention
limit c → ∞ (a candidate infimum at infinite key norm), or inconclusive.

See Also
--------
theory_kit.asymptotic.certificate : the certificate and the classification of a point.
theory_kit.asymptotic.drift_root : the fixed points at finite γ.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy import optimize

from ..io.progress import stage
from ..model.state import State
from .certificate import (
    PROBE_STEPS,
    RUNOFF,
    STABLE_KINDS,
    Certificate,
    FixedPoint,
    _certificate,
    _classify,
    _drift_tol,
    _eig_tol,
    _Local,
    _newton_ready,
    _probe,
    _runoff_certificate,
    step_scale,
)
from .deterministic import KEY_CAP, PairwiseError, ZeroOrthogonal
from .objectives import DRIFT_TOL, KeySpace, Objective, SampledError, max_key_norm
from .trust_newton import HANDOVER_GTOL, has_products, trust_newton

RUNOFF_FACTOR = 300.0   # a descent whose ‖x‖ grows past this factor has run off (runoff_bound)


# ----------------------------------------------------------------------------- descent
def _minimise(obj: Objective, x0: np.ndarray, maxiter: int,
              bound: float = np.inf, gtol: float = 1e-12, key_bound: float = np.inf,
              tol: float | None = None) -> tuple[np.ndarray, bool]:
    """L-BFGS from x0: (the last iterate, whether it was stopped for ‖x‖ > ``bound`` or a key
    norm > ``key_bound``); ``gtol``: L-BFGS-B's bound on the largest gradient entry.

    ``tol`` (objectives with exact Hessian products only, :func:`.trust_newton.has_products`):
    L-BFGS stops at ``HANDOVER_GTOL`` instead, and trust-region Newton on the products takes
    x on until ‖∇E‖ meets the certificate's ``tol`` (:func:`.trust_newton.trust_newton`)."""
    last = [x0]
    def outside(y: np.ndarray) -> bool:
        # a finite ``key_bound`` comes with KeySpace objectives only (``solve_gradient_flow``)
        return bool(np.linalg.norm(y) > bound or (
            np.isfinite(key_bound) and max_key_norm(cast(KeySpace, obj), y) > key_bound))

    newton = tol is not None and has_products(obj)
    if newton:
        gtol = max(gtol, HANDOVER_GTOL)

    def watch(xk: np.ndarray) -> None:
        last[0] = xk.copy()
        if outside(xk):
            raise StopIteration

    with stage("minimise (L-BFGS)"):
        res = optimize.minimize(obj.value_and_grad, x0, jac=True, method="L-BFGS-B",
                                callback=watch, options={"maxiter": maxiter, "gtol": gtol,
                                                         "ftol": 1e-15, "maxcor": 30})
    x = res.x if res.x is not None else last[0]
    if newton and not outside(x):
        assert tol is not None
        return trust_newton(cast(SampledError, obj), x, tol, outside)
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
    def size(mu: float) -> float:
        return float(np.sqrt(np.sum((c / (eigs + mu)) ** 2)))
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


def _newton(obj: Objective, x: np.ndarray, Z: np.ndarray, Hq: np.ndarray,
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


# -------------------------------------------------------------------- sampled E (and the loop)
def solve_gradient_flow(obj: SampledError, state: State, tol: float = DRIFT_TOL,
                        max_escapes: int = 4, maxiter: int = 3000,
                        coarse: SampledError | None = None,
                        key_bound: float = np.inf) -> FixedPoint:
    """A certified local minimum of the sampled E reached from ``state``.

    Loop: L-BFGS from x to ``trust_newton.HANDOVER_GTOL``, then trust-region Newton on the exact
    Hessian products until ‖∇E‖ ≤ tol (:func:`_minimise`); quotient Hessian Hq = Zᵀ∇²E Z (exact
    products, ``SampledError.hessian``; gauge removed by :func:`objectives.gauge_directions`,
    a negative λ within the sampling error of the curvature counted as flat:
    ``certificate._classify``); if its smallest eigenvalue
    λ < −eig_tol the point is a saddle: recorded, and x moves to the lower side along the
    eigenvector (:func:`escape`), up to ``max_escapes`` times; if |λ| ≤ eig_tol, E is probed
    along it (rises on both sides: degenerate minimum; else escaped as a saddle); at a minimum,
    chord-Newton steps on the quotient until ‖∇E‖ ≤ tol (absolute).  The certificate says what
    the last point is.

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
        x, ran_off = _minimise(obj, x, maxiter, bound, gtol, key_bound, tol)
        if ran_off or beyond(x):
            return x, None, saddles
        local = _classify(obj, x)
        if local.kind != "saddle":
            # a degenerate minimum whose smallest eigenvalue is positive (inside its
            # tolerance) still has a positive definite Hq, which trust-region Newton needs:
            # L-BFGS alone ended such a point at ½‖∇E‖ = 7.7e-7 (softmax-1, F = 4, ν = 10,
            # 4 heads, λ_min = 3.3e-5 against a tolerance 3.7e-5)
            if _newton_ready(local):
                with stage("Newton"):
                    y, exact = _newton(obj, x, local.Z, local.Hq, tol)
                moved = np.linalg.norm(y - x) > RECLASSIFY_MOVE * max(1.0, float(np.linalg.norm(x)))
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
        with stage("saddle escape"):
            x = escape(obj, x, local.vecs[:, 0])
    return x, local, saddles


def _presolve(obj: SampledError, coarse: SampledError, x: np.ndarray, max_escapes: int,
              maxiter: int, bound: float, key_bound: float = np.inf
              ) -> tuple[np.ndarray, list[dict]]:
    """The descent loop of :func:`solve_gradient_flow` (L-BFGS, quotient Hessian, escapes) on
    ``coarse``; returns (start for ``obj``, the coarse saddles passed).  Its point is kept only
    when it did not run off (``bound``) and ``obj``'s E is lower there than at x: a sample set
    4x smaller can have minima the keys fit (rare events at strong signal) that the full set
    does not, and then the full solve starts from x as without it."""
    with stage(f"presolve on {coarse.n} points"):
        return _coarse_descent(obj, coarse, x, max_escapes, maxiter, bound, key_bound)


def _coarse_descent(obj: SampledError, coarse: SampledError, x: np.ndarray, max_escapes: int,
                    maxiter: int, bound: float, key_bound: float) -> tuple[np.ndarray, list[dict]]:
    """The loop of :func:`_presolve`."""
    y, saddles = x, []
    for attempt in range(max_escapes + 1):
        y, ran_off = _minimise(coarse, y, maxiter, bound, key_bound=key_bound, tol=DRIFT_TOL)
        if ran_off:
            return x, []
        local = _classify(coarse, y)
        if local.kind != "saddle":
            break
        saddles.append(_saddle_record(coarse, y, local.eigs[0], coarse.n))
        if _stalled(saddles) or attempt == max_escapes:
            break
        with stage("saddle escape"):
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


def escape(obj: Objective, x: np.ndarray, v: np.ndarray) -> np.ndarray:
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


def _saddle_record(obj: Objective, x: np.ndarray, min_eigenvalue: float, points: object
                   ) -> dict:
    """What a run reports of a saddle it escaped: E there, the negative curvature, the
    objective's points and the state."""
    return {"sampled_error": obj.value_and_grad(x)[0], "min_eigenvalue": float(min_eigenvalue),
            "points": points, "state": obj.state(x).to_dict()}


# ----------------------------------------------------------------------------- deterministic E
GRADIENT_UNRESOLVED = "gradient unresolved"


def _rough_descent(obj: PairwiseError, view: Objective, x: np.ndarray, maxiter: int,
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
    with their error, saddles escaped, trust-region Newton).  Certificate:
    ``drift_norm`` = ½‖∂E/∂x‖ (full space)
    against ½ ``tol`` (as the sampled solver's), ``drift_stderr`` = ½ its abs_err (two
    resolutions of every sub-model, ``PairwiseError.evaluate``); a gradient whose error exceeds
    ``tol`` cannot certify (kind "gradient unresolved"); the eigenvalue tolerance is the larger
    of :func:`_eig_tol` and the finite-difference errors.  ``sampled_error`` of the result holds
    the deterministic E (no samples), ``error_abs_err`` its abs_err."""
    start, evals0 = time.perf_counter(), obj.evaluations
    saddles: list[dict]
    view: Objective                                       # obj or its face
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


def _at_finer_levels(obj: PairwiseError, view: Objective, x: np.ndarray, local: "_Local | None",
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
            y, _ = _newton(view, cast(ZeroOrthogonal, view).restrict(x) if face else x,
                           local.Z, local.Hq, tol)
        x = cast(ZeroOrthogonal, view).embed(y) if face else y
        evaluated = obj.evaluate(x, tol)
    return x, evaluated


# ----------------------------------------------------------------------------- run-offs
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
