"""The fixed point at the hand-over: solved for, checked, refined and polished
(docs/theory.md §6).

From the state where the flow handed over (module ``convergence``),
:func:`solve_fixed_point` solves for the fixed point: in gradient flow a certified local
minimum of the sampled E (``gradient_flow.solve_gradient_flow``), at finite γ a stable root of
the full drift (``drift_root.solve_drift_root``).  :func:`solve_checked` compares the sampled E
at the solution with the precise E (:func:`precise_error`; ``certificate.check_objective``) and
solves again on 4x the points where the keys separated the sample set, ended at a
sample-fitting saddle or ran off; a run-off still there at the end is checked on held-out
points (:func:`held_out_runoff_check`).  :func:`sample_shift` measures how far E moves when the
fixed point is solved again on an independent sample set,

    |E_3(x₂) − E_3(x₁)|,   x₁, x₂ solved on sets 1, 2, both evaluated on set 3.

The polish (``RunSettings.polish``) then minimises and certifies on a deterministic E wherever
one exists (:func:`deterministic_objective`: the pairwise decomposition for per-head
activations, any H; the drift engine's E for joint normalisers, H ≤ 3), whose value and
abs_err become E∞ (:func:`polish_pairwise`); an uncertified polish is handed to the boundary
minima (``boundary``: heads switching off, b_h → −∞; ``saturation``: b_h → +∞).

See Also
--------
theory_kit.asymptotic.gradient_flow : the minimisation and its certificate.
theory_kit.asymptotic.runs : the run that calls it (``run_to_convergence``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..dynamics.ode import build_system
from ..expect.engines import DriftEngine
from ..expect.error import ErrorValue, population_error
from ..io.progress import stage
from ..model.activations import Activation
from ..model.state import State
from ..model.task import Task
from . import laplace_objective
from .boundary import REVIVALS, boundary_minimum, revived_state, saddle_record
from .certificate import RUNOFF, FixedPoint, check_objective
from .convergence import RunSettings, _advance, solver_objective
from .deterministic import PairwiseError
from .drift_root import DriftMap, solve_drift_root
from .gradient_flow import (
    RUNOFF_GROWTH,
    RunoffCheck,
    polish_gradient_flow,
    runoff_check,
    solve_gradient_flow,
)
from .saturation import saturated_minimum, unsaturated_state

HELD_OUT = 3            # seed offset of the held-out points of a run-off check (1, 2: sample_shift)


# ----------------------------------------------------------------------------- precise E
def precise_error(task: Task, act: Activation, state: State, method: str = "auto",
                  mc_samples: int = 400_000, seed: int = 12345) -> ErrorValue:
    """E at ``state`` by ``error.population_error`` (``auto``: quadrature, with Monte Carlo
    when quadrature cannot reach 1e-8); with ``mc``, ``mc_samples`` noise draws.

    ``deterministic``: the pairwise Laplace engine where it applies (per-head activations,
    discrete priors, any H: ``expect.pairwise``, E-only patterns of 1- and 2-head sub-models),
    else ``auto``."""
    if method == "mc":
        return population_error(task, act, state, method="mc", n=mc_samples, seed=seed)
    if method == "deterministic":
        if pairwise_applies(task, act, state.H):
            pair_act = pairwise_activation(task, act, state.H)
            assert pair_act is not None              # what pairwise_applies checks
            obj = PairwiseError.for_activation(task, pair_act, state.H)
            value, err = obj.engine.error(*obj.unpack(obj.pack_state(state)))
            return ErrorValue(value, err, "laplace pairs")
        method = "auto"
    return population_error(task, act, state, method=method)


# ----------------------------------------------------------------------------- the solve
def solve_fixed_point(task: Task, act: Activation, state: State, settings: RunSettings,
                      engine: DriftEngine | None = None, offset: int = 0,
                      key_bound: float = np.inf) -> FixedPoint:
    """The certified fixed point reached from ``state``.

    Gradient flow: :func:`gradient_flow.solve_gradient_flow` on :func:`solver_objective` (its
    descent stopped where a key norm passes ``key_bound``).
    Finite γ: :func:`drift_root.solve_drift_root` on the full drift of ``engine`` (the
    ODE's; ``offset`` shifts its seed), escaping saddles by an ODE chunk."""
    if settings.gradient_flow:
        coarse = None
        if settings.solver_coarse > 1 and settings.solver_points // settings.solver_coarse >= 256:
            coarse = solver_objective(task, act, state.H, dataclasses.replace(
                settings, solver_points=settings.solver_points // settings.solver_coarse), offset)
        return solve_gradient_flow(solver_objective(task, act, state.H, settings, offset),
                                   state, settings.drift_tol, settings.max_escapes,
                                   coarse=coarse, key_bound=key_bound)
    if engine is None or offset:
        engine = dataclasses.replace(settings, mc_seed=settings.mc_seed + offset).engine(
            task, act, state.H)
    system, _ = build_system(task, act, state.H, engine, settings.gamma, None, None, None,
                             None, False, False)
    dmap = DriftMap(system, act.a_default(state.H, task.L), act.b_default(state.H, task.L),
                    act.train_a, act.train_b)
    return solve_drift_root(dmap, state, lambda s: _advance(task, act, s, settings.rule.chunk,
                                                            settings, engine)[0],
                            settings.drift_tol, settings.max_escapes)


def solve_checked(task: Task, act: Activation, start: State, settings: RunSettings,
                  engine: DriftEngine | None = None
                  ) -> tuple[FixedPoint, ErrorValue, RunSettings]:
    """The fixed point from ``start`` (:func:`solve_fixed_point`), E there by the precise
    engine, and the settings finally used.

    In gradient flow the solver's sampled E at its solution is compared with the precise E
    (:func:`certificate.check_objective`).  Where they disagree the sample set was one the keys
    could separate (rare events at strong signal): the solve is repeated from ``start`` with
    4x the solver points, up to ``settings.solver_refine`` times; if it still disagrees the
    certificate says "objective unreliable".  A solve that ends at a saddle it could not leave
    is repeated once with 4x the points too (when ``solver_refine`` ≥ 1): measured at F = 4,
    ν = 10, H = 4, B-softmax on 2^11–2^12 points ran off to large keys on a sample-fitting
    saddle (E_n below the true E by 1.5e-3) that 4x the points do not have.  A run-off ("keys
    diverge") is solved again on 4x the points at every attempt (the fitting it comes from
    recedes as the points grow: softmax at F = 4, ν = 10, H = 4 ran off on 2^14 tilted points
    and certifies a bounded minimum on 2^15 plain ones); one still running off at the last
    attempt is checked on a held-out point set (:func:`gradient_flow.runoff_check`, stored as the
    fixed point's ``runoff``): does the population E fall along the run-off, or rise?

    With the polish (``settings.polish``, where it applies) the sampled solve runs once and
    neither its precise E nor the re-solves on more points are computed: the polish takes only
    the sampled state and whether it ran off (then it starts from ``start``), and its own
    deterministic E and certificate replace both (the sampled state is kept in the result's
    ``presolve``).  There the sampled descent is stopped as soon as a key norm passes
    :func:`polish_key_bound` (the polish would not start from such a point), and a run-off
    gets no held-out check (the polish, not the check, decides)."""
    used = settings
    polish = settings.polish != "none" and polish_applies(task, act, start.H, settings.polish)
    key_bound = polish_key_bound(start) if polish else np.inf
    for attempt in range(settings.solver_refine + 1):
        with stage(f"sampled solve on {used.solver_points} points" if settings.gradient_flow
                   else "fixed point"):
            fixed = solve_fixed_point(task, act, start, used, engine, key_bound=key_bound)
        if polish:      # the polish takes the sampled point or, after a run-off, the hand-over
            break       # (polish_pairwise): no precise E there, no re-solve on more points
        with stage("precise E at the solution"):
            final = precise_error(task, act, fixed.state, settings.error_method,
                                  settings.error_samples)
        if not settings.gradient_flow:
            break
        obj = solver_objective(task, act, start.H, used)  # the solver's, rebuilt
        x = obj.pack_state(fixed.state)
        cert = check_objective(fixed.certificate, fixed.sampled_error, obj.value_stderr(x),
                               final.value, final.abs_err)
        fixed = dataclasses.replace(fixed, certificate=cert)
        refine = cert.kind in ("objective unreliable", RUNOFF) or (
            cert.kind == "saddle" and attempt == 0)
        if not refine or attempt == settings.solver_refine:
            break
        used = dataclasses.replace(used, solver_points=4 * used.solver_points)
    if settings.gradient_flow and fixed.certificate.kind == RUNOFF and not polish:
        with stage("run-off check on held-out points"):
            check = held_out_runoff_check(task, act, start, fixed.state, used)
        fixed = dataclasses.replace(fixed, runoff=check.to_dict())
    if polish:
        with stage("polish (deterministic E)"):
            fixed, final = polish_pairwise(task, act, start, fixed, settings.drift_tol)
    return fixed, final, used


def held_out_runoff_check(task: Task, act: Activation, start: State, end: State,
                          settings: RunSettings) -> RunoffCheck:
    """:func:`gradient_flow.runoff_check` of a run-off from ``start`` to ``end`` on the held-out
    point set of ``settings``' solver objective (seed offset ``HELD_OUT``)."""
    held_out = solver_objective(task, act, start.H, settings, offset=HELD_OUT)
    return runoff_check(held_out, held_out.pack_state(end), held_out.pack_state(start))


def sample_shift(task: Task, act: Activation, fixed: FixedPoint, settings: RunSettings) -> float:
    """|E(x₂) − E(x₁)|: x₁ = ``fixed``, x₂ the fixed point solved again from x₁ on an independent
    sample set (seed offset 1), both evaluated on a third independent set of the same size
    (common points, so the difference is resolved even where E itself is not)."""
    try:
        again = solve_fixed_point(task, act, fixed.state, dataclasses.replace(
            settings, max_escapes=0), offset=1)
    except ValueError:
        return float("nan")
    if again.certificate.kind == "not converged":   # no second fixed point: nothing measured
        return float("nan")
    judge = solver_objective(task, act, fixed.state.H, settings, offset=2)
    values = [judge.value_and_grad(judge.pack_state(s))[0] for s in (fixed.state, again.state)]
    return float(abs(values[1] - values[0]))


# ----------------------------------------------------------------------------- the polish
def pairwise_activation(task: Task, act: Activation, H: int) -> Activation | None:
    """The activation whose pairwise decomposition (``expect.pairwise``) is E of (task, act, H),
    or None: ``act`` itself where the engine covers it; at H = 1 a joint normaliser with
    φ = e^s and κ = 0 is the per-head one, and the head's offset (Bayes or not: −Q_hh/2 +
    log π_h, the same for every token) multiplies each weight's numerator and the normaliser
    alike, so it cancels: the per-head e^s with the same a.  Why: at H = 1 B-softmax is
    softmax, and without this its E∞ was the sampled solver's — measured at F = 4, ν = 10,
    L = 5: the key 3.068 u₁ (2^12 tilted points) at E = 0.0626799 ± 9e-16, 1.4e-4 above the
    minimum 0.0625382 at √10 u₁, with an abs_err that covered the evaluation only."""
    from ..expect.pairwise import applicability
    if applicability(task, act, H)[0]:
        return act
    if H == 1 and act.norm == "joint" and act.kappa == 0 and act.is_plain_exp:
        plain = dataclasses.replace(act, name=f"{act.name} (one head)", norm="per-head",
                                    offset="none", log_pi=None)
        if applicability(task, plain, 1)[0]:
            return plain
    return None


def pairwise_applies(task: Task, act: Activation, H: int) -> bool:
    """Whether the deterministic pairwise engine covers (task, act, H)
    (:func:`pairwise_activation`)."""
    return pairwise_activation(task, act, H) is not None


def polish_applies(task: Task, act: Activation, H: int, mode: str = "pairwise") -> bool:
    """Whether the polish ``mode`` (:data:`convergence.POLISH`) has a deterministic E for
    (task, act, H) (:func:`deterministic_objective`): "pairwise" any, "per-head" the pairwise
    decomposition's only."""
    if mode == "per-head":
        return pairwise_applies(task, act, H)
    return pairwise_applies(task, act, H) or _joint_laplace_applies(task, act, H)


def _joint_laplace_applies(task: Task, act: Activation, H: int) -> bool:
    return act.norm == "joint" and laplace_objective.applies(task, act, H)


def deterministic_objective(task: Task, act: Activation, H: int):
    """The deterministic E that the polish minimises, or None: the pairwise decomposition
    where it applies (:func:`pairwise_activation`), else for a joint normaliser the drift
    engine's (``laplace_objective.LaplaceError``, H ≤ 3)."""
    plain = pairwise_activation(task, act, H)
    if plain is not None:
        return PairwiseError.for_activation(task, plain, H)
    if _joint_laplace_applies(task, act, H):
        return laplace_objective.LaplaceError(task, act, H, act.a_default(H, task.L),
                                              act.b_default(H, task.L), act.train_a,
                                              act.train_b)
    return None


def largest_key_norm(state: State) -> float:
    """max_h |k_h| = max_h √Q_hh."""
    return float(np.sqrt(np.max(np.diag(state.Q))))


def polish_key_bound(start: State) -> float:
    """The largest key norm at which a sampled solution can still start the polish
    (:func:`polish_from_sampled`): ``gradient_flow.RUNOFF_GROWTH`` × max(1, the hand-over's)."""
    return RUNOFF_GROWTH * max(1.0, largest_key_norm(start))


def polish_from_sampled(start: State, sampled: FixedPoint) -> bool:
    """Whether the polish starts from the sampled solution (else from the hand-over
    ``start``): only from a certified one whose largest key norm stays within
    ``gradient_flow.RUNOFF_GROWTH`` × max(1, the hand-over's).  A sampled descent that fitted its
    points ends far out without running off past ``gradient_flow.runoff_bound`` (softmax,
    F = 4, ν = 10, H = 8 on 2^15 points: heads at |k| ≈ 600–900 against ≈ 1.6 at the
    hand-over), where the Laplace grids of a pair grow without bound (measured: a polish
    started there was killed at 20 GB); with the precise-E check of the sampled point skipped,
    its certificate and key norms are all there is to go by."""
    if not sampled.certificate.certified:
        return False
    return largest_key_norm(sampled.state) <= polish_key_bound(start)


def polish_pairwise(task: Task, act: Activation, start: State, sampled: FixedPoint,
                    tol: float) -> tuple[FixedPoint, ErrorValue]:
    """The sampled solver's fixed point polished and certified on the deterministic E
    (:func:`gradient_flow.polish_gradient_flow` on :func:`deterministic_objective`: the pairwise
    decomposition, or the drift engine's E for a joint normaliser with H ≤ 3): from the
    sampled solution, or from the hand-over ``start`` when that is not certified or far out
    (:func:`polish_from_sampled`: a run-off or a sample artefact).  The sampled solve is kept in
    the result's
    ``presolve`` (certificate, sampled E, run-off check); E and its abs_err are the
    deterministic engine's at the polished point.  A polish that does not certify because
    heads switch off (softmax-1: b_h → −∞) is handed to :func:`boundary.boundary_minimum`,
    whose result (kind "boundary minimum", E the live heads' model's) replaces it; one that
    is still uncertified, to :func:`saturation.saturated_minimum` (heads whose b_h → +∞),
    whose result replaces it when it certifies.  A boundary saddle (a head revived at some
    key lowers E, or a saturated head that would rather come back to finite b) is left from
    :func:`boundary.revived_state` or :func:`saturation.unsaturated_state` and polished
    again, up to ``boundary.REVIVALS`` times; it is recorded among the result's saddles."""
    obj = deterministic_objective(task, act, start.H)
    origin = sampled.state if polish_from_sampled(start, sampled) else start
    fixed = _polish_to_the_boundaries(obj, origin, tol)
    for _ in range(REVIVALS):
        moved = revived_state(obj, fixed) or unsaturated_state(obj, fixed)
        if moved is None:
            break
        again = _polish_to_the_boundaries(obj, moved, tol)
        fixed = dataclasses.replace(
            again, saddles=fixed.saddles + [saddle_record(fixed)] + again.saddles,
            evaluations=fixed.evaluations + again.evaluations,
            seconds=fixed.seconds + again.seconds,
            solver=f"{again.solver} (after a boundary saddle, left along its falling bias)")
    presolve = {"certificate": sampled.certificate.to_dict(), "solver": sampled.solver,
                "sampled_error": sampled.sampled_error, "runoff": sampled.runoff,
                "saddles": len(sampled.saddles), "seconds": sampled.seconds,
                "state": sampled.state.to_dict(), "key_bound": polish_key_bound(start),
                "polished_from": "hand-over" if origin is start else "sampled solution"}
    fixed = dataclasses.replace(fixed, presolve=presolve)
    assert fixed.error_abs_err is not None       # the deterministic polish sets it
    return fixed, ErrorValue(fixed.sampled_error, float(fixed.error_abs_err),
                              "laplace pairs" if isinstance(obj, PairwiseError) else obj.n,
                              {"level": obj.level})


def _polish_to_the_boundaries(obj, origin: State, tol: float) -> FixedPoint:
    """:func:`gradient_flow.polish_gradient_flow` from ``origin``; uncertified, on the pairwise
    engine, handed to :func:`boundary.boundary_minimum` (heads switching off), and if still
    uncertified to :func:`saturation.saturated_minimum` (heads saturating), whose result
    replaces it when it certifies or is a saddle (for the caller to leave)."""
    fixed = polish_gradient_flow(obj, obj.pack_state(origin), tol)
    boundaries = isinstance(obj, PairwiseError)      # both need the pairwise sub-models
    if boundaries and not fixed.certificate.certified:
        fixed = boundary_minimum(obj, fixed, tol) or fixed
    if boundaries and not fixed.certificate.certified:
        saturated = saturated_minimum(obj, fixed, tol)
        if saturated is not None and (saturated.certificate.certified
                                      or saturated.certificate.kind == "saddle"):
            fixed = saturated           # a saddle there is left by unsaturated_state
    return fixed
