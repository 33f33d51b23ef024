"""Boundary minima of E at b_h → +∞: heads whose extra token fades out (docs/theory.md §6,
"Heads that saturate").

With an extra token κ > 0 in a per-head normaliser (softmax-1), a head's weights are

    W_hl = e^{s_hl + b_h} / (κ + Σ_l' e^{s_hl' + b_h}) = e^{s_hl} / (κ e^{−b_h} + Σ_l' e^{s_hl'}),

so as b_h → +∞ the head tends to a plain softmax head (κ = 0) with the same output weight.
When that head is better than every head with κ e^{−b_h} > 0, gradient flow drives b_h to +∞:
E(b_h) = E_sat + c_h e^{−b_h} + O(e^{−2 b_h}) has no minimum at finite b_h, only the infimum
E_sat (measured: F = 4, ν = 10, L = 5, H = 1, the polish ends near b = 9 and rising, "saddle" with
λ_min ≈ −4e-11, the curvature along b falling like e^{−b}).  The other boundary of the same
coordinate, b_h → −∞, is module ``boundary``.

**The certificate** (:func:`saturated_minimum`) of the end x of such a polish, all on the
deterministic E (``deterministic.PairwiseError``):

1. *Candidates* S: the heads with ∂E/∂b_h < 0 (the flow raises b_h) and b_h ≥ ``SAT_START``.
2. *Saturated model*: b_h = ``B_SAT`` for h ∈ S, held fixed (``objectives.KeySpace.frozen_b``);
   every other coordinate polished and certified (``gradient_flow.polish_gradient_flow``).  At
   B_SAT the engine's E is E_sat to c_h e^{−B_SAT} (≈ 1e-13 c_h), which is added to abs_err.
3. *The corner* κ_S = 0 in the coordinates κ_h = e^{−b_h} ≥ 0, where E is smooth:

       E = E_sat + Σ_h c_h κ_h + κᵀ G δx + ½ δxᵀ H δx + ½ κᵀ K κ + …,

   c_h = lim −e^{b} ∂E/∂b_h, and K, G the second derivatives in κ (:class:`Corner`, from the
   heads' terms at b_h = 8 and 10, extrapolated to κ = 0; their error from the same at 10 and
   12 and at a coarser resolution).  Heads with c_h > its error hold the corner at first order.
   For the others c_h = 0 within its error — and that is what happens at a plain-softmax
   optimum: a head whose weights are already the conditional mean of the signal location
   given its scores gains nothing, at first order, from scaling them by 1 − κ/N — and the
   corner is a minimum when the Schur complement S = K − Gᵀ H⁻¹ G (H the certified Hessian of
   the saturated model) is positive definite on them.  Then E∞ ≥ E_sat − |err c|²/(2 λ_min(S)),
   added to abs_err.  A slope below −its error: "saddle" (a finite b_h is better).
4. The run's E must not rise: E_sat ≤ E(x) + abs_err (else the flow was going elsewhere).

Applies to per-head normalisers with κ > 0, trained b and untrained a.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..expect import laplace as lp
from ..model.state import State
from .certificate import BOUNDARY, Certificate, FixedPoint
from .deterministic import PairwiseError
from .gradient_flow import polish_gradient_flow

SAT_START = 4.0        # a head with b_h below this is not taken for saturating
B_SAT = 30.0           # b_h = +∞ represented here: κ_h = e^{−30} ≈ 9e-14
PROBES = (8.0, 10.0)   # b_h of the two κ differences (κ_h = 3.4e-4, 4.5e-5)
PROBE_SHIFT = 2.0      # the differences again this much deeper: their truncation error
SLOPE_LEVEL = 1.0      # resolution of the slopes: at 0.5625, −e^{b} ∂E/∂b at b = 14 was off
                       # by 25 % (∂E/∂b off by 1e-10; F = 1, ν = 10, L = 5, H = 1)


def applies(obj: PairwiseError) -> bool:
    """Whether heads of ``obj`` can saturate: per-head norm, κ > 0, trained b, untrained a."""
    return bool(obj.train_b and not obj.train_a and obj.act.kappa > 0
                and obj.act.norm == "per-head")


def candidates(obj: PairwiseError, x: np.ndarray, tol: float) -> list[int]:
    """The heads with b_h ≥ ``SAT_START`` and ∂E/∂b_h not positive beyond its error at x.  Not
    "negative beyond its error": where the slope c_h vanishes (step 3) ∂E/∂b_h falls like
    e^{−2b_h} and is within its error at b_h ≈ 5 already (F = 4, ν = 10, L = 5, H = 1:
    −2.0e-9 against 2.1e-9).  The corner test decides; this only picks what to test."""
    _, _, grad, grad_err = obj.evaluate(x, tol)
    b, db = obj.unpack(x)[2], obj.unpack(grad)[2]
    return [int(h) for h in np.flatnonzero((db <= grad_err) & (b >= SAT_START))]


def saturated_objective(obj: PairwiseError, b: np.ndarray, heads: list[int]) -> PairwiseError:
    """``obj`` with the b of ``heads`` held at ``B_SAT`` (the others start from ``b``)."""
    b0 = np.array(b, float)
    b0[heads] = B_SAT
    return dataclasses.replace(obj, b0=b0, frozen_b=tuple(sorted(heads)))


@dataclass
class Corner:
    """E near κ_S = 0 (module docstring, step 3) at the saturated model's point ``x`` (its
    coordinates: ``sat``'s), to second order: :meth:`derivatives` gives c (n,), K (n, n) and
    G (sat.dim, n) for the n = len(``heads``) saturated heads."""

    sat: PairwiseError
    x: np.ndarray
    heads: list[int]

    def fields(self, biases: dict[int, float], head: int, level: float):
        """The terms of E that contain ``head``, with the b of ``biases`` changed."""
        K, a, b = self.sat.unpack(self.x)
        for h, v in biases.items():
            b[h] = v
        return self.sat.engine.fields(K, a, b, level=level, heads=[head])

    def derivatives(self, probes: tuple[float, float], level: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(c, K, G) from κ differences at the two ``probes`` b, each linearly extrapolated to
        κ = 0: a difference quotient D(κ) = D(0) + O(κ) gives
        D(0) = (κ₁D(κ₂) − κ₂D(κ₁))/(κ₁ − κ₂)."""
        (b1, b2), n = probes, len(self.heads)
        k1, k2 = np.exp(-b1), np.exp(-b2)
        c, Kmat, G = np.zeros(n), np.zeros((n, n)), np.zeros((self.sat.dim, n))
        for i, h in enumerate(self.heads):
            f1, f2 = (self.fields({h: b}, h, level) for b in (b1, b2))
            g0 = self.sat.pack(*_grads(self.fields({}, h, level)))
            s1, s2 = -f1.db[h] / k1, -f2.db[h] / k2          # ∂E/∂κ_h = −e^{b} ∂E/∂b_h
            Kmat[i, i] = (s1 - s2) / (k1 - k2)
            c[i] = s2 - Kmat[i, i] * k2
            d1, d2 = ((self.sat.pack(*_grads(f)) - g0) / k for f, k in ((f1, k1), (f2, k2)))
            G[:, i] = (k1 * d2 - k2 * d1) / (k1 - k2)
            for j, g in enumerate(self.heads[:i]):
                both = self.fields({h: b2, g: b2}, h, level)
                Kmat[i, j] = Kmat[j, i] = (-both.db[h] / k2 - s2) / k2
        return c, Kmat, G


def _grads(f) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return f.dK, f.da, f.db


def corner_test(sat: PairwiseError, x: np.ndarray, heads: list[int]) -> dict:
    """Slopes c with their errors and, for the heads whose slope is zero within its error, the
    smallest eigenvalue of the Schur complement S = K − Gᵀ H⁻¹ G with its error (module
    docstring, step 3); errors: the largest change under probes ``PROBE_SHIFT`` deeper and
    under the resolution ``SLOPE_LEVEL`` × ``laplace.COARSE``."""
    corner = Corner(sat, x, heads)
    deep = (PROBES[0] + PROBE_SHIFT, PROBES[1] + PROBE_SHIFT)
    runs = [corner.derivatives(PROBES, SLOPE_LEVEL), corner.derivatives(deep, SLOPE_LEVEL),
            corner.derivatives(PROBES, SLOPE_LEVEL * lp.COARSE)]
    c, c_err = runs[0][0], np.max([np.abs(r[0] - runs[0][0]) for r in runs[1:]], axis=0)
    flat = [i for i in range(len(heads)) if abs(c[i]) <= c_err[i]]
    out = {"slopes": c.tolist(), "slope_errs": c_err.tolist(), "flat": [heads[i] for i in flat],
           "schur_min": None, "schur_err": 0.0, "hessian_min": None}
    if not flat:
        return out
    Z = sat.quotient(x)
    Hq, hess_err = sat.hessian(x, Z)
    schur, lever = [], 0.0
    for _, Kmat, G in runs:
        step = np.linalg.solve(Hq, Z.T @ G[:, flat])         # H⁻¹ G: the x response to κ
        schur.append(Kmat[np.ix_(flat, flat)] - (Z.T @ G[:, flat]).T @ step)
        lever = lever or float(np.linalg.norm(step, 2))
    # δ(Gᵀ H⁻¹ G) = −(H⁻¹G)ᵀ δH (H⁻¹G): the Hessian's own error enters through the lever |H⁻¹G|²
    out["schur_min"] = float(np.linalg.eigvalsh(schur[0])[0])
    out["schur_err"] = float(max(np.linalg.norm(s - schur[0], 2) for s in schur[1:])
                             + hess_err * lever ** 2)
    out["hessian_min"] = float(np.linalg.eigvalsh(Hq)[0])
    return out


def saturated_minimum(obj: PairwiseError, fixed: FixedPoint, tol: float) -> FixedPoint | None:
    """The boundary minimum at b_h = +∞ that the uncertified polish ``fixed`` tends to (module
    docstring), or None when no head saturates or the saturated model does not certify.

    The result's certificate has kind ``BOUNDARY`` when the corner test passes (every slope
    positive beyond its error, or zero within it with a positive Schur complement) and E did
    not rise, else "saddle" (a slope below −its error) or "objective unreliable"; drift norm
    and eigenvalue are the saturated model's (its coordinates exclude the saturated b).  The
    state holds b_h = ``B_SAT``; ``sampled_error`` is E there, ``error_abs_err`` its abs_err
    plus Σ_h |c_h| e^{−B_SAT} and the flat slopes' |err c|²/(2 λ_min(S)).  ``boundary``
    records the side (+∞), the heads, the corner test and the polish that was handed over."""
    if not applies(obj):
        return None
    start, evals0 = time.perf_counter(), obj.evaluations
    heads = candidates(obj, obj.pack_state(fixed.state), tol)
    if not heads:
        return None
    sat = saturated_objective(obj, fixed.state.b, heads)
    reduced = polish_gradient_flow(sat, sat.pack_state(fixed.state), tol)
    if not reduced.certificate.certified:
        return None
    test = corner_test(sat, sat.pack_state(reduced.state), heads)
    kind, margin = corner_verdict(test)
    # the deterministic polish sets error_abs_err
    assert reduced.error_abs_err is not None and fixed.error_abs_err is not None
    value_err = (float(reduced.error_abs_err) + margin
                 + sum(abs(c) for c in test["slopes"]) * float(np.exp(-B_SAT)))
    lower = reduced.sampled_error <= fixed.sampled_error + value_err + float(fixed.error_abs_err)
    if kind == BOUNDARY and not lower:
        kind = "objective unreliable"
    rc = reduced.certificate
    cert = Certificate(rc.drift_norm, rc.drift_tol, rc.min_eigenvalue, rc.eig_tol, kind,
                       rc.zero_modes, rc.drift_stderr)
    record = {"side": "+inf", "saturated": heads, "b_sat": B_SAT, "probes": list(PROBES),
              **test, "polish": {"certificate": fixed.certificate.to_dict(),
                                 "sampled_error": fixed.sampled_error,
                                 "error_abs_err": fixed.error_abs_err,
                                 "state": fixed.state.to_dict()}}
    solver = (f"{fixed.solver}; then {len(heads)} saturating heads held at b = {B_SAT:g}, the "
              f"rest polished, the corner κ = e^(-b) = 0 tested (boundary minimum at b = +∞)")
    return dataclasses.replace(
        fixed, state=reduced.state, certificate=cert, solver=solver,
        sampled_error=reduced.sampled_error, error_abs_err=value_err,
        saddles=fixed.saddles + reduced.saddles,
        evaluations=fixed.evaluations + obj.evaluations - evals0 + reduced.evaluations,
        seconds=fixed.seconds + time.perf_counter() - start, boundary=record)


LADDER_GAIN = 1e-6      # a ladder leaving a boundary saddle starts where the fall is this
LADDER_STEPS = 30       # rungs (steps of 1 in b)


def bias_ladder(obj: PairwiseError, at: Callable[[float], State], first: float, step: float,
                error: float) -> State | None:
    """The lowest-E state on the ladder at(first), at(first + step), … (E at ``obj``'s level),
    walked while E falls below ``error`` and at most ``LADDER_STEPS`` rungs; None when the
    first rung does not fall.  How a boundary saddle is left (a head revived from b = −∞,
    ``boundary.revived_state``; a head brought back from b = +∞, :func:`unsaturated_state`):
    how far the linear fall e^{±b} c holds depends on the key, so the bias is searched."""
    best, bias = None, first
    for _ in range(LADDER_STEPS):
        value = obj.error_at(at(bias))
        if value >= error:
            break
        best, error = bias, value
        bias += step
    return None if best is None else at(best)


def unsaturated_state(obj: PairwiseError, fixed: FixedPoint) -> State | None:
    """Where to continue from a saturated corner that is a saddle (kind "saddle" on the side
    +∞: slopes c_h < −their error, so E falls as κ_h = e^{−b_h} grows from 0), or None: the
    saturated state with those heads' b lowered together along :func:`bias_ladder`, from b
    where κ_h |c_h| = ``LADDER_GAIN`` down in steps of 1.  Without this the polish cannot
    leave: at b = ``B_SAT`` the gradient along b is ~e^{−30} (tests/test_boundary.py)."""
    rec = fixed.boundary
    if fixed.certificate.kind != "saddle" or rec is None or rec.get("side") != "+inf":
        return None
    c, err = np.array(rec["slopes"]), np.array(rec["slope_errs"])
    falling = [(h, abs(ci)) for h, ci, ei in zip(rec["saturated"], c, err) if ci < -ei]
    state = fixed.state

    def at(shift: float) -> State:
        b = np.array(state.b, float)
        for h, slope in falling:
            b[h] = float(np.log(slope / LADDER_GAIN)) + shift
        return State(state.M, state.Q, state.a, b)

    return bias_ladder(obj, at, 0.0, -1.0, float(fixed.sampled_error))


def corner_verdict(test: dict) -> tuple[str, float]:
    """(kind, the bound |err c|²/(2 λ_min(S)) on how far E may fall below E_sat) of
    :func:`corner_test`'s record."""
    c, err = np.array(test["slopes"]), np.array(test["slope_errs"])
    if np.any(c < -err):
        return "saddle", 0.0
    if not test["flat"]:
        return BOUNDARY, 0.0
    lam, lam_err = test["schur_min"], test["schur_err"]
    if lam <= lam_err:
        return "objective unreliable", 0.0
    return BOUNDARY, float(np.sum(err[np.abs(c) <= err] ** 2) / (2.0 * (lam - lam_err)))
