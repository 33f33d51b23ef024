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
(``deterministic.PairwiseError``):

1. *Prune*: the heads with ∂E/∂b_h > 0 whose removal does not raise E beyond its abs_err.
2. *Reduced model*: the live heads alone, an H'-head model, polished and certified
   (``gradient_flow.polish_gradient_flow``; again pruned if it has silent heads of its own, and
   handed to ``saturation.saturated_minimum`` if its heads go the other way, b_h → +∞).
3. *Revival*: adding a head g with key k at b → −∞ changes E by e^{b} c(k) + O(e^{2b}),
   the revival slope (:class:`RevivalSlope`)

       c(k) = lim_{b→−∞} e^{−b} [E(live, (k, b)) − E(live)] = lim_{b→−∞} e^{−b} ∂E/∂b_g,

   evaluated by the second form (the derivative route) on the pairwise engine of the
   (H' + 1)-head model, at b = min(live b, 0) − ``PROBE_DEPTH``: every term of ∂E/∂b_g carries
   g's weights, so it is computed to the engine's relative precision however small e^{b} is,
   where the first form subtracts two E of O(1) and multiplies their difference by e^{−b}
   (at ν = 0.5, F = 2, H = 4 its value at a live key's copy was 0.34 at one resolution and
   −5.7 at the next, e^{−b} = 2.4e7; the derivative route gave 0.35946 at both).  On the
   boundary E does not depend on the silent heads' keys, so the boundary point is a local
   minimum only if c(k) ≥ 0 for *every* key: c is minimised over k (L-BFGS with the gradient
   e^{−b} ∂E/∂k_g = ∇c + O(e^{b}), keys within ``deterministic.KEY_CAP``) from the pruned heads'
   keys and from copies of the live ones.  Every start and every end of the search is
   checked (level and linearity: the same at a coarser resolution and at b −
   ``LINEARITY_STEP``): certified when each c exceeds its error, a saddle when some c lies
   below −its error.
   That the starts find the global minimum of c over k is not proved (a local search, as
   every minimiser in this package); their number and the capped ones are reported.
4. *The reported state*: the H-head state with the live heads of the reduced solution and
   the pruned ones at b = b_probe − ``OFF_DEPTH``, whose E and gradient the full H-head
   engine recomputes: E agrees with the reduced model's within their errors, and that
   difference is part of the stated abs_err.  E∞ is the reduced model's E (the infimum).
5. *A boundary saddle is left* (:func:`revived_state`): the head is revived at the key with
   c < 0 and the polish starts again from there (``solve.polish_pairwise``, up to
   ``REVIVALS`` times; the saddle is recorded among the run's saddles).

Applies to trained b, untrained a (with a trained a a head leaves by a_h → 0 at finite
parameters, where ordinary minima exist) and κ > 0.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..expect import laplace as lp
from ..model.state import State
from .certificate import BOUNDARY, Certificate, FixedPoint
from .deterministic import KEY_CAP, KeyCap, PairwiseError
from .gradient_flow import polish_gradient_flow
from .saturation import LADDER_GAIN, bias_ladder, saturated_minimum

# b of a revived head: min(live b, 0) − this.  The derivative route has no cancellation, so the
# probe can sit where the O(e^{b}) remainder is below round-off: c at 24, 36 and 52 below the
# lowest live b equal to 1e-10 relative, at 12 below off by 1e-5 – 9e-5 relative (F = 2,
# ν = 0.5, L = 5, H' = 3, Fig. 4's right panel).
PROBE_DEPTH = 36.0
LINEARITY_STEP = 4.0     # c(k) again at b − this: the O(e^{b}) remainder of the linearisation
OFF_DEPTH = 24.0         # the pruned heads of the reported state sit at b_probe − this
MAX_DEPTH = 2            # rounds of pruning (the reduced model may have silent heads too)
REVIVALS = 2             # boundary saddles left by reviving a head, per polish
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


def switching_off(obj: PairwiseError, state: State, tol: float) -> tuple[list[int], dict]:
    """(the heads to prune, per candidate E(x) − E(x without it)): candidates are the heads
    with ∂E/∂b_h > 0 (the flow lowers their b), pruned unless their removal raises E by more
    than the abs_err of E at x (``PairwiseLaplace.evaluate``).  Both E at the resolution that
    evaluation settled on: at a coarser one the two decompositions differ by their own
    truncation (a head at b = −54 "raised" E by 5.8e-9 at level 0.5625, by 2e-15 at 1.0,
    F = 2, ν = 0.5, H = 4).  A head so silent that its removal changes E by less than the
    error is pruned too: what certifies the boundary is the reduced model and the revival
    slopes, not this choice."""
    f = obj.engine.evaluate(*obj.unpack(obj.pack_state(state)), tol=tol, counted=obj.pack)
    gains = {}
    for h in map(int, np.flatnonzero(f.db > 0)):
        rest = [g for g in range(obj.H) if g != h]
        if rest:
            gains[h] = f.value - sub_objective(obj, rest).error_at(sub_state(state, rest),
                                                                   f.level)
    return [h for h, gain in gains.items() if gain > -f.value_err], gains


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
        """b of the revived head: min(live b, 0) − ``PROBE_DEPTH``.  The head's own weights
        e^{s+b}/(κ + Σ e^{s+b}) set how linear E is in e^{b}, so b must be deep in absolute
        terms too: below live heads that saturate (b = 30, ``saturation.B_SAT``) the live
        biases alone would put the probe at b = −6."""
        return min(float(np.min(self.b_live)), 0.0) - PROBE_DEPTH

    def _keys(self, k: np.ndarray) -> np.ndarray:
        return np.vstack([self.K_live, k])

    def _biases(self, b: float) -> np.ndarray:
        return np.append(self.b_live, b)

    def value_and_grad(self, k: np.ndarray, b: float, level: float) -> tuple[float, np.ndarray]:
        """(c, ∂c/∂k) at key k from the head at finite b: e^{−b} (∂E/∂b_g, ∂E/∂k_g), the
        decomposition's terms with g only (the rest do not depend on g); beyond the key cap
        the continuous extension ``deterministic.KeyCap`` (c grows fast with |k|, ~2e7 at a
        pruned head's key at F = 2, ν = 0.5, and L-BFGS's first step from there tried
        |k| = 2.5e6)."""
        self.evaluations += 1
        cap = KeyCap(np.atleast_2d(k))
        f = self.obj.engine.fields(self._keys(cap.clipped[0]), self.a, self._biases(b),
                                   level=level, heads=[len(self.K_live)])
        scale = np.exp(-b)
        return (cap.value(scale * float(f.db[-1])),
                cap.gradient(scale * f.dK[-1:])[0])

    def minimise(self, k0: np.ndarray, b: float, level: float
                 ) -> tuple[np.ndarray, bool, np.ndarray | None]:
        """L-BFGS of c from k0: (last key, whether it was stopped at |k| > ``KEY_CAP``, the
        first iterate with c < 0 or None)."""
        last, first_negative = [np.asarray(k0, float)], [None]

        def watch(intermediate_result: optimize.OptimizeResult) -> None:
            k = np.asarray(intermediate_result.x, float).copy()
            last[0] = k
            if first_negative[0] is None and intermediate_result.fun < 0:
                first_negative[0] = k
            if np.linalg.norm(k) > KEY_CAP:
                raise StopIteration

        res = optimize.minimize(self.value_and_grad, k0, args=(b, level), jac=True,
                                method="L-BFGS-B", callback=watch,
                                options={"maxiter": REVIVAL_MAXITER, "gtol": REVIVAL_GTOL})
        k = res.x if res.x is not None else last[0]
        if np.linalg.norm(k) > KEY_CAP:
            k = last[0]
        capped = bool(np.linalg.norm(k) >= KEY_CAP * (1 - 1e-9) or
                      np.linalg.norm(last[0]) > KEY_CAP)
        return k, capped, first_negative[0]

    def checked(self, k: np.ndarray, b: float, level: float) -> tuple[float, float]:
        """(c(k), its error): the largest change under a coarser resolution (level ×
        ``laplace.COARSE``) and under b − ``LINEARITY_STEP`` (the linearisation's remainder)."""
        c = self.value_and_grad(k, b, level)[0]
        c_coarse = self.value_and_grad(k, b, level * lp.COARSE)[0]
        c_deep = self.value_and_grad(k, b - LINEARITY_STEP, level)[0]
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


def revival_probes(reduced: State, width: int) -> list[np.ndarray]:
    """Keys where c is checked without a search: ±r u_f along every feature, r the live heads'
    rms key norm.  Why: the searches from the pruned and the live keys can all run off to
    large |k| where c < 0 only asymptotically (one live head along u₁, F = 2, ν = 3: both
    went to m₁ < 0, |k| ≈ 4, while c(√3 u₂) = −9.2 with the linear regime down to b ≈ −12)."""
    F = reduced.M.shape[1]
    r = float(np.sqrt(np.mean(np.diag(reduced.Q))))
    probes = []
    for f in range(F):
        for sign in (1.0, -1.0):
            k = np.zeros(width)
            k[f] = sign * r
            probes.append(k)
    return probes


def revival(slope: RevivalSlope, starts: list[np.ndarray], level: float, descent: float,
            probes: Sequence[np.ndarray] = ()) -> dict:
    """The revival slopes found: each start minimised at ``descent`` level, then every start
    and every end checked at ``level`` (:meth:`RevivalSlope.checked`), and so is each
    search's first iterate with c < 0 (its "crossing") and each of ``probes``
    (:func:`revival_probes`); a start whose c is unresolved is left out of the verdict.
    Verdict "negative"
    when some key has c < −its error (a revived head there lowers E: the point is a saddle of
    the boundary; the most negative such key is reported, and all of them in
    ``negative_keys`` with their c, by key norm), "positive" when every key has
    c > its error (the smallest is reported), else "unresolved".  Why every key: where c < 0
    the minimisation runs on to large |k|, where c grows like e^{|k|²/2} and its quadrature
    is no longer resolved (F = 2, ν = 0.5: c = −1.4e9 ± 5.1e9 at |k| = 6.9, where the start
    itself had a resolved c < 0); the crossing is where the search first found c < 0, before
    it ran on (two starts with c ≈ +7e-7 whose searches ended at the key cap, c = −2e11 ±
    1e13: tests/test_boundary.py)."""
    b = slope.probe_bias()
    ends, crossings, capped = [], [], 0
    for k0 in starts:
        k, hit, negative = slope.minimise(k0, b, descent)
        ends.append(k)
        crossings += [] if negative is None else [negative]
        capped += int(hit)
    groups = {"starts": [np.asarray(k, float) for k in starts], "ends": ends,
              "crossings": crossings, "probes": [np.asarray(k, float) for k in probes]}
    keys = [k for group in groups.values() for k in group]
    checks = np.array([slope.checked(k, b, level) for k in keys])       # (keys, 2)
    c, err = checks[:, 0], checks[:, 1]
    norms = np.linalg.norm(np.array(keys), axis=1)
    # a start whose c is unresolved does not count: its search descended from it (L-BFGS's
    # line search only accepts falls), so its end bounds it (a pruned head's key that had
    # drifted to |k| = 7.3 while silent: c = 1.8e10 ± 2.4e10, its end 0.0478 ± 1.2e-6)
    counts = np.abs(c) > err
    counts[len(starts):] = True
    negative = np.flatnonzero(c < -err)
    if negative.size:
        verdict, i = "negative", int(negative[np.argmin(c[negative])])
    elif np.all(c[counts] > err[counts]):
        verdict, i = "positive", int(np.flatnonzero(counts)[np.argmin(c[counts])])
    else:
        verdict, i = "unresolved", int(np.argmin(np.where(counts & (np.abs(c) <= err),
                                                          c - err, np.inf)))
    out = {"verdict": verdict, "slope": float(c[i]), "slope_err": float(err[i]),
           "key": keys[i].tolist(), "key_norm": float(norms[i]),
           "negative_keys": [(keys[j].tolist(), float(c[j]))
                             for j in sorted(negative, key=lambda j: norms[j])],
           "starts": len(starts), "capped": capped, "b_probe": b, "key_cap": KEY_CAP}
    lo = 0
    for name, group in groups.items():
        out[f"at_{name}"] = c[lo:lo + len(group)].tolist()
        out[f"errors_at_{name}"] = err[lo:lo + len(group)].tolist()
        lo += len(group)
    return out


def assembled_state(state: State, live: list[int], reduced: State, off_bias: float,
                    revive: tuple[np.ndarray, float] | None = None) -> State:
    """The H-head state: live heads from ``reduced``, each pruned head g at its own m_g and
    |k_g| (orthogonal part along a direction of its own) with b = ``off_bias``; with
    ``revive`` = (k, b), the first pruned head instead at the revival key k (coordinates of
    :class:`RevivalSlope`: features, the live heads' orthogonal factor, its own direction)
    and bias b."""
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
    if revive is not None:
        k, g = np.asarray(revive[0], float), pruned[0]
        K[g] = 0.0
        K[g, :F + len(live)], K[g, F + len(live)] = k[:F + len(live)], k[-1]
        b[g] = float(revive[1])
    return State(K[:, :F], K @ K.T, a, b)


def revived_state(obj: PairwiseError, fixed: FixedPoint) -> State | None:
    """Where to continue from a boundary saddle (kind "saddle" with the revival verdict
    "negative": a head revived at a key k with c(k) < 0 lowers E like e^{b} c(k)), or None:
    the boundary state with its first pruned head at such a key and the bias that minimises
    E on the ladder b₀, b₀ + 1, … (``saturation.bias_ladder``), from b₀ where e^{b₀}|c| =
    ``saturation.LADDER_GAIN`` (a fall that E resolves); the keys with c < 0 are tried by increasing
    norm until one lowers E.  Why: how far the linear fall holds depends on the key — at
    |k| = 4.2 c was −19 at b = −36 and +1194 at b = −20 (its e^{s+b} reach 1 in the score
    tail), so E never resolves the fall, while at |k| = 3.4 (F = 2, ν = 0.5, H = 4) it does."""
    rec = fixed.boundary
    if (fixed.certificate.kind != "saddle" or rec is None
            or rec.get("revival", {}).get("verdict") != "negative"):
        return None
    rv = rec["revival"]
    reduced = State(*(np.asarray(rec["reduced"]["state"][k], float) for k in "MQab"))
    start = State(*(np.asarray(rec["polish"]["state"][k], float) for k in "MQab"))
    off = rv["b_probe"] - OFF_DEPTH
    for key, c in rv["negative_keys"]:
        def at(bias: float, key: np.ndarray = np.asarray(key, float)) -> State:
            return assembled_state(start, rec["live"], reduced, off, revive=(key, bias))

        revived = bias_ladder(obj, at, float(np.log(LADDER_GAIN / abs(c))), 1.0,
                              float(fixed.sampled_error))
        if revived is not None:
            return revived
    return None


def saddle_record(fixed: FixedPoint) -> dict:
    """What a run reports of a boundary saddle it left (as ``gradient_flow`` does of a saddle):
    E there, the side, the negative slope(s) with their errors (the revival slope at b = −∞;
    the corner slopes c_h at b = +∞), and the state."""
    rec = fixed.boundary
    assert rec is not None                       # a boundary point (``saddle_record``'s callers)
    if rec.get("side") == "+inf":
        slope, err = min(rec["slopes"]), rec["slope_errs"][int(np.argmin(rec["slopes"]))]
    else:
        slope, err = rec["revival"]["slope"], rec["revival"]["slope_err"]
    return {"kind": "boundary saddle", "side": rec.get("side", "-inf"),
            "sampled_error": fixed.sampled_error, "min_eigenvalue": None, "slope": slope,
            "slope_err": err, "state": fixed.state.to_dict()}


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
    assert obj.level is not None and obj.descent_level is not None   # set in __post_init__
    assert reduced_fp.error_abs_err is not None  # the deterministic polish sets it
    found_slope = revival(slope, revival_starts(fixed.state, pruned, reduced_fp.state,
                                                slope.width), obj.level, obj.descent_level,
                          revival_probes(reduced_fp.state, slope.width))
    state = assembled_state(fixed.state, live, reduced_fp.state,
                            found_slope["b_probe"] - OFF_DEPTH)
    value, value_err, grad, grad_err = obj.evaluate(obj.pack_state(state), tol)
    rc = reduced_fp.certificate
    gap = abs(value - reduced_fp.sampled_error)
    ok = found_slope["verdict"] == "positive" and gap <= value_err + float(
        reduced_fp.error_abs_err)
    kind = BOUNDARY if ok else ("saddle" if found_slope["verdict"] == "negative"
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
