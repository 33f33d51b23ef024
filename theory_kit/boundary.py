"""Boundary minima of E: heads that switch off (docs/theory.md §6, "Heads that switch off").

With a trained score bias and an extra token κ > 0 in the normaliser (softmax-1:
N_h = κ + Σ_l e^{t_hl}), a head can leave the model continuously: as b_h → −∞ its weights
W_hl = e^{t_hl}/N_h vanish like e^{b_h}, and E tends to the error of the model without it.
When that model is better, gradient flow sends b_h to −∞: E has no minimum at finite
parameters, only an infimum on the boundary b_h = −∞, approached exponentially slowly (the
curvature along b_h is ∝ e^{b_h}; measured at F = 4, ν = 10, L = 5, H = 8: four of eight heads
at b ≈ −11 … −13 with ∂E/∂b_h > 0, the Hessian's smallest eigenvalue 4e-8, a "saddle" that
L-BFGS and Newton cannot leave, docs/theory.md §6).

**The certificate** (:func:`boundary_minimum`) of such a point x, all on the deterministic E
(``fixedpoint.PairwiseError``):

1. *Prune*: the heads with ∂E/∂b_h > 0 whose removal does not raise E beyond its abs_err.
2. *Reduced model*: the live heads alone, an H'-head model, polished and certified
   (``fixedpoint.polish_gradient_flow``; again pruned if it has silent heads of its own, and
   handed to ``saturation.saturated_minimum`` if its heads go the other way, b_h → +∞).
3. *Revival*: adding a head g with key k at b → −∞ changes E by e^{b} c(k) + O(e^{2b}),
   the revival slope (:class:`RevivalSlope`)

       c(k) = lim_{b→−∞} e^{−b} [E(live, (k, b)) − E(live)]
            = lim e^{−b} [Σ_{h live} (E_2(g, h) − E_1(h)) − (H' − 1)(E_1(g) − 1 − Δ)]

   in the pairwise decomposition (``expect.pairwise``; c_{H'+1} − c_{H'} = H' − 1).  On the
   boundary E does not depend on the silent heads' keys, so the boundary point is a local
   minimum only if c(k) ≥ 0 for *every* key: c is minimised over k (L-BFGS with its exact
   gradient e^{−b} ∂E/∂k_g, keys within ``fixedpoint.KEY_CAP``) from the pruned heads' keys
   and from copies of the live ones.  Certified when the smallest c found exceeds its error
   (level and linearity: the same at a coarser resolution and at b − ``LINEARITY_STEP``).
   That the starts find the global minimum of c over k is not proved (a local search, as
   every minimiser in this package); their number and the capped ones are reported.
4. *The reported state*: the H-head state with the live heads of the reduced solution and
   the pruned ones at b = b_probe − ``OFF_DEPTH``, whose E and gradient the full H-head
   engine recomputes: E agrees with the reduced model's within their errors, and that
   difference is part of the stated abs_err.  E∞ is the reduced model's E (the infimum).

Applies to trained b, untrained a (with a trained a a head leaves by a_h → 0 at finite
parameters, where ordinary minima exist) and κ > 0.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from .expect import laplace as lp
from .fixedpoint import (BOUNDARY, KEY_CAP, Certificate, FixedPoint, PairwiseError,
                         polish_gradient_flow)
from .model import State
from .saturation import saturated_minimum

PROBE_DEPTH = 12.0       # b of a revived head: min live b − this (weights ≲ e^{-12} of theirs)
LINEARITY_STEP = 4.0     # c(k) again at b − this: the O(e^{b}) remainder of the linearisation
OFF_DEPTH = 24.0         # the pruned heads of the reported state sit at b_probe − this
MAX_DEPTH = 2            # rounds of pruning (the reduced model may have silent heads too)
REVIVAL_MAXITER = 60     # L-BFGS iterations per start of the revival search
REVIVAL_GTOL = 1e-7      # on the largest entry of ∂c/∂k (c is O(1e-2) at F = 4, ν = 10)


def applies(obj: PairwiseError) -> bool:
    """Whether heads of ``obj`` can switch off: trained b, untrained a, κ > 0."""
    return bool(obj.train_b and not obj.train_a and obj.act.kappa > 0)


def sub_state(state: State, heads: list[int]) -> State:
    """The order parameters of ``heads`` alone (rows of M, the block of Q, entries of a, b)."""
    i = np.asarray(heads, int)
    return State(state.M[i], state.Q[np.ix_(i, i)], state.a[i], state.b[i])


def sub_objective(obj: PairwiseError, heads: list[int]) -> PairwiseError:
    """``obj`` restricted to ``heads`` (same task, activation, flags and resolutions)."""
    i = np.asarray(heads, int)
    return PairwiseError(obj.task, obj.act, len(i), np.asarray(obj.a0, float)[i],
                         np.asarray(obj.b0, float)[i], obj.train_a, obj.train_b,
                         level=obj.level, descent_level=obj.descent_level)


def error_at(obj: PairwiseError, state: State) -> float:
    """E at ``state`` at ``obj``'s fixed resolution."""
    return obj.value_and_grad(obj.pack_state(state))[0]


def switching_off(obj: PairwiseError, state: State, tol: float) -> tuple[list[int], dict]:
    """(the heads to prune, per candidate E(x) − E(x without it)): candidates are the heads
    with ∂E/∂b_h > 0 (the flow lowers their b), pruned unless their removal raises E by more
    than the abs_err of E at x (``PairwiseError.evaluate``).  A head so silent that its
    removal changes E by less than that error is pruned too: what certifies the boundary is
    the reduced model and the revival slopes, not this choice."""
    value, value_err, grad, _ = obj.evaluate(obj.pack_state(state), tol)
    db = obj.unpack(grad)[2]
    gains = {}
    for h in map(int, np.flatnonzero(db > 0)):
        rest = [g for g in range(obj.H) if g != h]
        if rest:
            gains[h] = value - error_at(sub_objective(obj, rest), sub_state(state, rest))
    return [h for h, gain in gains.items() if gain > -value_err], gains


@dataclass
class RevivalSlope:
    """c(k) of one head g added to the live heads at b → −∞ (module docstring, step 3), and
    ∂c/∂k, on the pairwise engine of the (H' + 1)-head model.

    ``K_live``: the live keys, (H', F + H' + 1) — their own coordinates padded with a zero
    column, so that k ∈ R^{F+H'+1} may leave their span; ``a``: (H' + 1,) output weights
    (the new head's last); ``b_live``: (H',)."""

    obj: PairwiseError
    K_live: np.ndarray
    a: np.ndarray
    b_live: np.ndarray
    evaluations: int = 0

    @classmethod
    def for_reduced(cls, reduced: PairwiseError, state: State, a_new: float) -> "RevivalSlope":
        K = reduced.unpack(reduced.pack_state(state))[0]
        model = dataclasses.replace(reduced, H=reduced.H + 1,
                                    a0=np.append(np.asarray(reduced.a0, float), a_new),
                                    b0=np.append(np.asarray(reduced.b0, float), 0.0))
        return cls(model, np.hstack([K, np.zeros((len(K), 1))]),
                   np.append(state.a, a_new), np.asarray(state.b, float))

    @property
    def width(self) -> int:
        return self.K_live.shape[1]

    def probe_bias(self) -> float:
        """b of the revived head: min live b − ``PROBE_DEPTH``."""
        return float(np.min(self.b_live)) - PROBE_DEPTH

    def base(self, level: float) -> float:
        """Σ_{h live} E_1(h) − (H' − 1)(1 + Δ): the terms of g's at b = −∞."""
        eng, K, b = self.obj.engine, self._keys(np.zeros(self.width)), self._biases(0.0)
        singles = sum(eng.sub_model(K, self.a, b, (h,), level)[0] for h in range(len(K) - 1))
        return singles - (len(K) - 2) * (1.0 + self.obj.task.delta)

    def _keys(self, k: np.ndarray) -> np.ndarray:
        return np.vstack([self.K_live, k])

    def _biases(self, b: float) -> np.ndarray:
        return np.append(self.b_live, b)

    def value_and_grad(self, k: np.ndarray, b: float, level: float, base: float
                       ) -> tuple[float, np.ndarray]:
        """(c, ∂c/∂k) at key k from the head at finite b: e^{−b} (terms with g − ``base``)."""
        self.evaluations += 1
        f = self.obj.engine.fields(self._keys(k), self.a, self._biases(b), level=level,
                                   heads=[len(self.K_live)])
        scale = np.exp(-b)
        return scale * (f.value - base), scale * f.dK[-1]

    def minimise(self, k0: np.ndarray, b: float, level: float) -> tuple[np.ndarray, bool]:
        """L-BFGS of c from k0: (last key, whether it was stopped at |k| > ``KEY_CAP``)."""
        base, last = self.base(level), [np.asarray(k0, float)]

        def watch(k: np.ndarray) -> None:
            last[0] = k.copy()
            if np.linalg.norm(k) > KEY_CAP:
                raise StopIteration

        res = optimize.minimize(self.value_and_grad, k0, args=(b, level, base), jac=True,
                                method="L-BFGS-B", callback=watch,
                                options={"maxiter": REVIVAL_MAXITER, "gtol": REVIVAL_GTOL})
        k = res.x if res.x is not None else last[0]
        if np.linalg.norm(k) > KEY_CAP:
            k = last[0]
        return k, bool(np.linalg.norm(k) >= KEY_CAP * (1 - 1e-9) or
                       np.linalg.norm(last[0]) > KEY_CAP)

    def checked(self, k: np.ndarray, b: float, level: float) -> tuple[float, float]:
        """(c(k), its error): the largest change under a coarser resolution (level ×
        ``laplace.COARSE``) and under b − ``LINEARITY_STEP`` (the linearisation's remainder)."""
        c = self.value_and_grad(k, b, level, self.base(level))[0]
        coarse = level * lp.COARSE
        c_coarse = self.value_and_grad(k, b, coarse, self.base(coarse))[0]
        c_deep = self.value_and_grad(k, b - LINEARITY_STEP, level, self.base(level))[0]
        return c, max(abs(c - c_coarse), abs(c - c_deep))


def revival_starts(state: State, pruned: list[int], reduced: State, width: int
                   ) -> list[np.ndarray]:
    """Keys from which c is minimised: each pruned head's (its feature overlaps m_g and norm
    |k_g|, its orthogonal part orthogonal to the live heads) and a copy of each live key."""
    F = state.M.shape[1]
    starts = []
    for g in pruned:
        k = np.zeros(width)
        k[:F] = state.M[g]
        k[-1] = np.sqrt(max(state.Q[g, g] - float(state.M[g] @ state.M[g]), 0.0))
        starts.append(k)
    P = reduced.orthogonal_factor()
    for h in range(reduced.H):
        starts.append(np.concatenate([reduced.M[h], P[h], [0.0]]))
    return starts


def revival(slope: RevivalSlope, starts: list[np.ndarray], level: float, descent: float
            ) -> dict:
    """The smallest revival slope found: each start minimised at ``descent`` level, the
    lowest end checked at ``level`` (:meth:`RevivalSlope.checked`); also c at the starts."""
    b = slope.probe_bias()
    ends, capped = [], 0
    for k0 in starts:
        k, hit = slope.minimise(k0, b, descent)
        ends.append(k)
        capped += int(hit)
    base = slope.base(descent)
    at_ends = [slope.value_and_grad(k, b, descent, base)[0] for k in ends]
    best = ends[int(np.argmin(at_ends))]
    c, c_err = slope.checked(best, b, level)
    return {"slope": c, "slope_err": c_err, "key_norm": float(np.linalg.norm(best)),
            "starts": len(starts), "capped": capped, "b_probe": b,
            "at_starts": [slope.value_and_grad(k, b, descent, base)[0] for k in starts],
            "at_ends": at_ends, "key_cap": KEY_CAP}


def assembled_state(state: State, live: list[int], reduced: State, off_bias: float) -> State:
    """The H-head state: live heads from ``reduced``, each pruned head g at its own m_g and
    |k_g| (orthogonal part along a direction of its own) with b = ``off_bias``."""
    H, F = state.H, state.M.shape[1]
    pruned = [g for g in range(H) if g not in live]
    P = reduced.orthogonal_factor()
    K = np.zeros((H, F + len(live) + len(pruned)))
    b = np.array(state.b, float)
    a = np.array(state.a, float)
    for row, h in enumerate(live):
        K[h, :F], K[h, F:F + len(live)] = reduced.M[row], P[row]
        a[h], b[h] = reduced.a[row], reduced.b[row]
    for j, g in enumerate(pruned):
        K[g, :F] = state.M[g]
        K[g, F + len(live) + j] = np.sqrt(max(state.Q[g, g] - float(state.M[g] @ state.M[g]),
                                              0.0))
        b[g] = off_bias
    return State(K[:, :F], K @ K.T, a, b)


def _reduced_fixed_point(obj: PairwiseError, state: State, tol: float, depth: int
                         ) -> tuple[list[int], FixedPoint, dict] | None:
    """(live heads, the certified fixed point of the live heads' model, its pruning record),
    pruning again inside the reduced model up to ``MAX_DEPTH`` rounds; None when nothing is
    pruned or the reduced model does not certify."""
    pruned, gains = switching_off(obj, state, tol)
    live = [h for h in range(obj.H) if h not in pruned]
    if not pruned or not live:
        return None
    reduced = sub_objective(obj, live)
    fixed = polish_gradient_flow(reduced, reduced.pack_state(sub_state(state, live)), tol)
    if not fixed.certificate.certified:         # the live heads may saturate (b → +∞)
        saturated = saturated_minimum(reduced, fixed, tol)
        if saturated is not None and saturated.certificate.certified:
            fixed = saturated
    record = {"pruned": pruned, "removal_gains": {str(h): g for h, g in gains.items()}}
    if fixed.certificate.certified:
        return live, fixed, record
    if depth + 1 >= MAX_DEPTH or not applies(reduced):
        return None
    inner = _reduced_fixed_point(reduced, fixed.state, tol, depth + 1)
    if inner is None:
        return None
    inner_live, inner_fixed, inner_record = inner
    record["then"] = inner_record
    return [live[i] for i in inner_live], inner_fixed, record


def boundary_minimum(obj: PairwiseError, fixed: FixedPoint, tol: float) -> FixedPoint | None:
    """The boundary minimum the uncertified polish ``fixed`` tends to (module docstring), or
    None when no head switches off or the live heads' model does not certify.

    The result's certificate has kind ``BOUNDARY`` when the smallest revival slope found is
    positive beyond its error, else "saddle" (a revived head lowers E); its drift norm,
    tolerance and min_eigenvalue are the reduced model's; ``sampled_error`` is the reduced
    model's E and ``error_abs_err`` its abs_err plus |E_H − E_H'| of the assembled state.
    ``boundary`` records the pruning, the revival search and both E."""
    if not applies(obj):
        return None
    start, evals0 = time.perf_counter(), obj.evaluations
    found = _reduced_fixed_point(obj, fixed.state, tol, 0)
    if found is None:
        return None
    live, reduced_fp, record = found
    reduced = sub_objective(obj, live)
    slope = RevivalSlope.for_reduced(reduced, reduced_fp.state, float(obj.a0[0]))
    pruned = [g for g in range(obj.H) if g not in live]
    found_slope = revival(slope, revival_starts(fixed.state, pruned, reduced_fp.state,
                                                slope.width), obj.level, obj.descent_level)
    state = assembled_state(fixed.state, live, reduced_fp.state,
                            found_slope["b_probe"] - OFF_DEPTH)
    value, value_err, grad, grad_err = obj.evaluate(obj.pack_state(state), tol)
    rc = reduced_fp.certificate
    gap = abs(value - reduced_fp.sampled_error)
    ok = found_slope["slope"] > found_slope["slope_err"] and gap <= value_err + float(
        reduced_fp.error_abs_err)
    kind = BOUNDARY if ok else ("saddle" if found_slope["slope"] < -found_slope["slope_err"]
                                else "objective unreliable")
    cert = Certificate(max(rc.drift_norm, 0.5 * float(np.linalg.norm(grad))), rc.drift_tol,
                       rc.min_eigenvalue, rc.eig_tol, kind, rc.zero_modes,
                       max(rc.drift_stderr, 0.5 * grad_err))
    record.update({"live": live, "reduced": reduced_fp.to_dict(), "revival": found_slope,
                   "full_error": value, "full_error_abs_err": value_err,
                   "polish": {"certificate": fixed.certificate.to_dict(),
                              "sampled_error": fixed.sampled_error,
                              "error_abs_err": fixed.error_abs_err,
                              "state": fixed.state.to_dict()}})
    solver = (f"{fixed.solver}; then {len(pruned)} switched-off heads pruned, the {len(live)} "
              f"live ones polished alone, revival slopes minimised from "
              f"{found_slope['starts']} keys (boundary minimum at b = −∞)")
    return dataclasses.replace(
        fixed, state=state, certificate=cert, solver=solver,
        sampled_error=reduced_fp.sampled_error,
        error_abs_err=float(reduced_fp.error_abs_err) + gap,
        saddles=fixed.saddles + reduced_fp.saddles,
        evaluations=fixed.evaluations + obj.evaluations - evals0 + reduced_fp.evaluations
        + slope.evaluations,
        seconds=fixed.seconds + time.perf_counter() - start, boundary=record)
