"""Asymptotic error E∞, the global minimum of E, and the Bayes floor (docs/theory.md §4, §6).

Three questions about one task and activation:

* **E∞** — where training ends.  The ODE of docs/theory.md §5 is integrated from several finite-D
  initialisations (``InitialCondition.draw`` with different seeds) until the state stops
  moving (:class:`StopRule`), and E is evaluated at the final order parameters with the
  most accurate error engine available.  Runs that end at different fixed points are
  reported as separate groups (:func:`group_runs`), never silently averaged.  At finite γ the
  γ² term keeps pumping noise into the keys, so E∞(γ) sits above the minimum gradient flow
  reaches; ``gradient_flow=True`` drops that term (time τ = γ t).
* **The floor** — the global minimum of E over the order parameters, by local optimisation
  from many starts in a parametrisation where every point is valid: keys in an
  (F+H)-dimensional space, K = [M | P] ∈ R^{H×(F+H)}, so Q = K Kᵀ and Q − M Mᵀ = P Pᵀ ⪰ 0.
  The objective is E on fixed samples (common random numbers) with its exact gradient
  (:class:`SampledError`); the minimiser is then re-evaluated with the precise engine.
* **Bayes-softmax optimality** — with the heads at the atoms of a discrete prior
  (k_h = U θ^(h), extra heads duplicating atoms with log π_h split among the copies),
  B-softmax weights are the Bayes posterior, so E = E_Bayes (:func:`bayes_softmax_at_atoms`).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from scipy import integrate, optimize
from scipy.optimize import linear_sum_assignment

from ..model.activations import Activation, activation_from_params, get_activation
from .boundary import REVIVALS, boundary_minimum, revived_state, saddle_record
from ..expect.error import METHODS as ERROR_METHODS
from ..kernels.codegen import sample_kernels
from ..expect.error import ErrorValue, bayes_error, population_error, squared_residual
from ..expect import montecarlo as mc
from ..io.executor import run_sweep, runs_in_process
from ..expect.drift import ENGINES, SampleDrift
from ..expect.engines import DEFAULT_QMC_POINTS, DriftEngine, build_engine
from .fixedpoint import POINTS, RUNOFF, RUNOFF_GROWTH, Certificate, DriftMap, FixedPoint, PairwiseError, RunoffCheck, SampledError, bayes_posterior, check_objective, polish_gradient_flow, runoff_check, solve_drift_root, solve_gradient_flow
from . import laplace_objective
from ..model.initial import InitialCondition
from ..model.priors import Prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int, fail
from ..dynamics.ode import METHODS as ODE_METHODS, BoundaryError, build_system, integrate_ode
from ..io.progress import progress_bar
from ..io.results import Checkpoint, read_json, read_piece, to_jsonable, write_json
from .saturation import saturated_minimum, unsaturated_state

MAX_SIGN_PATTERNS = 256
UNKNOWN_ERROR = "+/- unknown (not converged)"   # the text of a run without an error bar
FLOWS = ("ode", "sampled")
# RunSettings.polish: the deterministic solve after the sampled one — "pairwise" wherever a
# deterministic E exists (:func:`polish_applies`), "per-head" only on the pairwise
# decomposition (not the drift engine's E of a joint normaliser at H = 2, 3: ~130 CPU s per
# evaluation of E and its gradient at F = 4, ν = 10, L = 5, H = 2, measured; 11 evaluations
# in 24 CPU min, so a polish of ~100 would take hours)
POLISH = ("none", "pairwise", "per-head")
PRECISE_METHODS = ERROR_METHODS + ("deterministic",)   # precise_error's methods
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
            obj = PairwiseError.for_activation(task, pairwise_activation(task, act, state.H),
                                               state.H)
            value, err = obj.engine.error(*obj.unpack(obj.pack_state(state)))
            return ErrorValue(value, err, "laplace pairs")
        method = "auto"
    return population_error(task, act, state, method=method)


# ----------------------------------------------------------------------------- Bayes-softmax
def bayes_softmax_at_atoms(prior: Prior, H: int,
                           act: Activation | None = None) -> tuple[Activation, State]:
    """B-softmax heads at the atoms of a discrete prior, and the activation that makes them Bayes.

    Head h sits at atom j(h) = h mod K (K atoms, H ≥ K): m_h = θ^(j(h)), Q = M Mᵀ (no
    orthogonal part), a_h = 1, b_h = 0.  With o_h = −Q_hh/2 + log π_h and
    log π_h = log(π_{j(h)} / #copies of j(h)), the joint weights are

        w_l = Σ_h π_h e^{θ^(h)·p_l − |θ^(h)|²/2} / Σ_{h',l'} (…) = P(ε = l | X),

    the Bayes posterior, so E = E_Bayes exactly.  Returns (activation with those log π, state)."""
    if not prior.is_discrete:
        fail("prior", "must be discrete (flipping, discrete, empirical) to have atoms", prior.name)
    atoms, pi = prior.atoms()
    n_atoms = len(pi)
    check_int(H, "H", n_atoms)
    base = get_activation("bsoftmax") if act is None else act
    if base.offset != "bayes" or base.norm != "joint":
        fail("activation", "must be jointly normalised with Bayes offsets (bsoftmax)", base.name)
    owner = np.arange(H) % n_atoms
    copies = np.bincount(owner, minlength=n_atoms)
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi[owner] / copies[owner])
    M = atoms[owner]
    state = State(M, M @ M.T, np.ones(H), np.zeros(H))
    return dataclasses.replace(base, log_pi=tuple(float(x) for x in log_pi)), state


# ----------------------------------------------------------------------------- global minimum
@dataclass(frozen=True)
class MinimumResult:
    """The lowest E found, where, and every local minimum the starts reached."""

    error: ErrorValue
    state: State
    sampled_value: float
    local_minima: list[dict]
    params: dict

    def to_dict(self) -> dict:
        return {"global_min": self.error.value, "global_min_abs_err": self.error.abs_err,
                "global_min_method": self.error.method, "global_min_sampled": self.sampled_value,
                "argmin": self.state.to_dict(), "local_minima": self.local_minima,
                "params": self.params}


def _starting_points(obj: SampledError, n_starts: int, rng: np.random.Generator,
                     extra: list[State]) -> list[np.ndarray]:
    """Random keys at the prior's scale, heads near random atoms (discrete priors), and
    any given states (e.g. the end points of E∞ runs)."""
    F, H = obj.task.F, obj.H
    scale = float(np.sqrt(np.mean(obj.task.prior.second_moments())))
    atoms = obj.task.prior.atoms()[0] if obj.task.prior.is_discrete else None
    starts = [obj.pack_state(s) for s in extra]
    for i in range(n_starts):
        K = rng.standard_normal((H, F + H)) * scale / np.sqrt(F + H) * rng.uniform(0.3, 1.5)
        if atoms is not None and i % 2 == 1:
            K[:, :F] = atoms[rng.integers(len(atoms), size=H)] * rng.uniform(0.5, 1.2)
            K[:, F:] *= 0.1
        starts.append(obj.pack(K, obj.a0, obj.b0))
    return starts


def global_minimum(task: Task, act: Activation, H: int, n_starts: int = 12, n: int = 20_000,
                   seed: int = 0, train_a: bool | None = None, train_b: bool | None = None,
                   extra_starts: list[State] | None = None, method: str = "auto",
                   maxiter: int = 500) -> MinimumResult:
    """min E over (M, Q with Q − M Mᵀ ⪰ 0, trained a, b): L-BFGS from many starts.

    Each start is minimised on the same fixed samples (:class:`SampledError`, exact
    gradient), so all starts see one deterministic function.  The best minimiser and the
    given ``extra_starts`` themselves (e.g. E∞ end points, which may be closer to the true
    minimum than the minimiser of the n-sample objective, off by O(1/√n)) are evaluated by
    :func:`precise_error`, and the lowest is reported: E at a point that was found, an upper
    bound on the true minimum up to that engine's error, and never above a given start."""
    check_int(H, "H", 1)
    check_int(n_starts, "n_starts", 1)
    train_a = act.train_a if train_a is None else train_a
    train_b = act.train_b if train_b is None else train_b
    obj = SampledError.for_activation(task, act, H, n=n, seed=seed, train_a=train_a,
                                      train_b=train_b)
    found = []
    for x0 in _starting_points(obj, n_starts, np.random.default_rng(seed + 1), extra_starts or []):
        res = optimize.minimize(obj.value_and_grad, x0, jac=True, method="L-BFGS-B",
                                options={"maxiter": maxiter})
        found.append((float(res.fun), res.x, bool(res.success)))
    found.sort(key=lambda item: item[0])
    candidates = [obj.state(found[0][1])] + list(extra_starts or [])
    errors = [precise_error(task, act, s, method) for s in candidates]
    pick = int(np.argmin([e.value for e in errors]))
    minima = [{"sampled_error": v, "converged": ok, "state": obj.state(x).to_dict()}
              for v, x, ok in found]
    params = {"task": task.params(), "activation": act.params(), "H": H, "n_starts": n_starts,
              "n_samples": n, "seed": seed, "train_a": train_a, "train_b": train_b,
              "parametrisation": "K = [M | P] in R^{H x (F+H)}, Q = K K^T",
              "argmin_from": "optimiser" if pick == 0 else f"extra start {pick - 1}"}
    return MinimumResult(errors[pick], candidates[pick], found[0][0], minima, params)


# ----------------------------------------------------------------------------- grouping runs
def _sign_patterns(prior: Prior) -> np.ndarray:
    """Sign flips of the features that leave the prior (hence E) invariant."""
    sym = np.flatnonzero(prior.sign_symmetric())
    pats = []
    for signs in itertools.product([1.0, -1.0], repeat=len(sym)):
        s = np.ones(prior.F)
        s[sym] = signs
        pats.append(s)
        if len(pats) >= MAX_SIGN_PATTERNS:
            break
    return np.array(pats)


def state_distance(s1: State, s2: State, signs: np.ndarray | None = None) -> float:
    """Distance between two states up to the symmetries of E: head permutations and the
    sign flips of invariant features (rows of ``signs``).

    For each sign pattern, heads are matched by the Hungarian algorithm on
    |m_h − m'_π(h)|² + (Q_hh − Q'_π(h)π(h))² + |a_h − a'|² + |b_h − b'|², then the
    distance is the Frobenius norm of the differences of (M, Q, a, b) after matching,
    relative to 1 + the size of the states."""
    signs = np.ones((1, s1.F)) if signs is None else signs
    scale = 1.0 + max(np.linalg.norm(s1.Q), np.linalg.norm(s2.Q))
    best = np.inf
    for sg in signs:
        M2 = s2.M * sg
        desc1 = np.column_stack([s1.M, np.diag(s1.Q), s1.a, s1.b])
        desc2 = np.column_stack([M2, np.diag(s2.Q), s2.a, s2.b])
        cost = np.sum((desc1[:, None, :] - desc2[None, :, :]) ** 2, axis=-1)
        _, perm = linear_sum_assignment(cost)
        diff = np.sqrt(np.sum((s1.M - M2[perm]) ** 2)
                       + np.sum((s1.Q - s2.Q[np.ix_(perm, perm)]) ** 2)
                       + np.sum((s1.a - s2.a[perm]) ** 2) + np.sum((s1.b - s2.b[perm]) ** 2))
        best = min(best, diff / scale)
    return float(best)


def group_runs(states: list[State], errors: list[ErrorValue], prior: Prior,
               state_tol: float = 0.05, error_rtol: float = 1e-3) -> list[list[int]]:
    """Indices of runs grouped by the fixed point they reached.

    Two runs are linked when their errors agree (within 4 combined error estimates or a
    relative ``error_rtol``) and their states agree up to symmetry
    (:func:`state_distance` ≤ ``state_tol``); groups are the connected components."""
    n = len(states)
    signs = _sign_patterns(prior)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in itertools.combinations(range(n), 2):
        ei, ej = errors[i], errors[j]
        err_tol = max(4.0 * np.hypot(ei.abs_err, ej.abs_err),
                      error_rtol * max(abs(ei.value), abs(ej.value)))
        if abs(ei.value - ej.value) <= err_tol and \
                state_distance(states[i], states[j], signs) <= state_tol:
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: (min(errors[i].value for i in g), g[0]))


# ----------------------------------------------------------------------------- E∞ of one run
@dataclass(frozen=True)
class StopRule:
    """When a run has stopped moving.

    The state vector y = (M, Q, a, b) is integrated in chunks of ``chunk`` time units; after
    each chunk its relative speed (a chunk-averaged, relative drift norm)

        v_k = ‖y(t_k) − y(t_{k−1})‖ / (chunk · max(1, ‖y(t_k)‖))

    is recorded.  Near a stable fixed point the speeds fall geometrically, v_k ≈ v_{k−1} r
    with r < 1, and the relative distance still to travel is about the geometric tail
    v_k · chunk · r / (1 − r).  A run has converged when, over the last ``window`` chunks,
    the speeds fell at every chunk, with r the largest ratio in the window, the tail is
    below ``tol`` and t ≥ ``T_min``.  It stops unconverged at ``T_max`` (reported, never
    hidden).  The tail test is what keeps a run from stopping in a plateau — the slow
    unspecialised phase, where the speed bottoms out (r → 1) before it grows again — and
    what refuses to call converged a state that creeps on like 1/t (key norms still
    growing).  Times are in the ODE's clock: t, or τ = γ t in the gradient-flow limit."""

    tol: float = 3e-3
    chunk: float = 20.0
    window: int = 3
    T_min: float = 0.0
    T_max: float = 3000.0

    def __post_init__(self) -> None:
        for name in ("tol", "chunk", "T_max"):
            if not (np.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                fail(name, "must be a finite number > 0", getattr(self, name))
        check_int(self.window, "window", 1)
        if not (0 <= self.T_min <= self.T_max):
            fail("T_min", f"must lie in [0, T_max = {self.T_max:g}]", self.T_min)

    def tail(self, speeds: list[float]) -> float:
        """Estimated relative distance still to travel (inf unless the speeds keep falling)."""
        recent = np.asarray(speeds[-(self.window + 1):], dtype=float)
        if len(recent) < self.window + 1:
            return np.inf
        if recent[-1] == 0.0:
            return 0.0
        ratio = float(np.max(recent[1:] / np.maximum(recent[:-1], 1e-300)))
        return np.inf if ratio >= 1.0 else float(recent[-1] * self.chunk * ratio / (1.0 - ratio))

    def converged(self, t: float, speeds: list[float]) -> bool:
        return t >= self.T_min and self.tail(speeds) < self.tol

    def params(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EinfRun:
    """One run: its seed, the certified fixed point, E there (precise engine), and how it got
    there (ODE until ``T``, then the solver; ``fixed`` is None when the solver is off).

    ``converged`` is the certificate's verdict (or, without solver, the stop rule's).
    ``sample_shift`` is the measured shift of E when the fixed point is solved again on an
    independent sample set (NaN when not measured): the part of the error that ``abs_err`` of
    the evaluation does not include."""

    seed: int
    state: State
    error: ErrorValue
    T: float
    converged: bool
    speeds: list[float]
    history: dict
    tail: float = float("nan")
    fixed: FixedPoint | None = None
    sample_shift: float = float("nan")

    @property
    def certificate(self) -> Certificate | None:
        return None if self.fixed is None else self.fixed.certificate

    @property
    def abs_err_total(self) -> float:
        """hypot(evaluation error, sample shift) — the error bar to use for E∞ of this run;
        inf when the run is not certified (or, without solver, not converged): E is then known
        at a point that is not the fixed point, and the small error of evaluating E there says
        nothing about E∞ (``abs_err_reason`` says why)."""
        if not self.converged:
            return float("inf")
        shift = 0.0 if not np.isfinite(self.sample_shift) else self.sample_shift
        return float(np.hypot(self.error.abs_err, shift))

    @property
    def runoff_verdict(self) -> str | None:
        """The held-out check of a run whose keys diverged (``fixedpoint.runoff_check``), else None."""
        if self.fixed is None or not self.fixed.runoff:
            return None
        return self.fixed.runoff["verdict"]

    @property
    def abs_err_reason(self) -> str | None:
        """None for a certified run, else why its E∞ carries no error bar."""
        if self.converged:
            return None
        cert = self.certificate
        if cert is None:
            return f"not converged: the stop rule did not hold by T = {self.T:g}"
        return (f"not certified ({cert.kind}; drift norm {cert.drift_norm:.2g}, tolerance "
                f"{cert.drift_tol:.2g}): E is evaluated at a point that is not a certified "
                "fixed point")

    def to_dict(self) -> dict:
        """The run as JSON: ``abs_err`` is the error bar of E∞ (evaluation error ⊕ sample
        shift), null when the run is not certified (``abs_err_reason``); ``evaluation_abs_err``
        is the error of evaluating E at the reported state, whatever that state is."""
        cert = self.certificate
        fixed = None if self.fixed is None else {k: v for k, v in self.fixed.to_dict().items()
                                                 if k != "state"}
        return {"seed": self.seed, "einf": self.error.value, "abs_err": self.abs_err_total,
                "abs_err_reason": self.abs_err_reason,
                "evaluation_abs_err": self.error.abs_err,
                "method": self.error.method, "sample_shift": self.sample_shift,
                "abs_err_total": self.abs_err_total, "T": self.T, "T_handoff": self.T,
                "converged": self.converged,
                "certified": None if cert is None else cert.certified,
                "drift_norm": None if cert is None else cert.drift_norm,
                "min_eigenvalue": None if cert is None else cert.min_eigenvalue,
                "kind": None if cert is None else cert.kind,
                "solver": None if self.fixed is None else self.fixed.solver,
                "saddles_passed": 0 if self.fixed is None else len(self.fixed.saddles),
                "runoff_verdict": self.runoff_verdict,
                "final_speed": self.speeds[-1] if self.speeds else None,
                "tail": self.tail, "fixed_point": fixed,
                **self.state.to_dict(), "history": self.history}

    @classmethod
    def from_dict(cls, d: dict) -> "EinfRun":
        err = ErrorValue(d["einf"], d.get("evaluation_abs_err", d["abs_err"]), d["method"])
        speeds = d["history"]["speed"]
        state = State(d["M"], d["Q"], d["a"], d["b"])
        fixed = (None if d.get("fixed_point") is None
                 else FixedPoint.from_dict({**d["fixed_point"], "state": state.to_dict()}))
        return cls(d["seed"], state, err, d["T"], d["converged"], speeds, d["history"],
                   d.get("tail", float("nan")), fixed, d.get("sample_shift", float("nan")))


def admissible_state(M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray,
                     clip_tol: float = 1e-3) -> State:
    """A :class:`State` from integrated arrays, clipping round-off negative eigenvalues of the
    orthogonal part Q − M Mᵀ (≥ −clip_tol·scale); larger violations raise ValidationError.

    Gradient flow drives Q − M Mᵀ to zero, so integration error can leave it slightly
    indefinite; clipping moves Q by at most clip_tol·scale."""
    Q = 0.5 * (Q + Q.T)
    perp = Q - M @ M.T
    vals, vecs = np.linalg.eigh(perp)
    scale = max(1.0, float(np.max(np.abs(Q))))
    if vals.min() < -clip_tol * scale:
        fail("Q - M M^T", "left the admissible set during integration (reduce gamma or dt)",
             vals.min())
    perp = (vecs * np.clip(vals, 0.0, None)) @ vecs.T
    return State(M, M @ M.T + perp, a, b)


def _flat(state: State) -> np.ndarray:
    return np.concatenate([state.M.ravel(), state.Q.ravel(), state.a, state.b])


def relative_speed(old: State, new: State, span: float) -> float:
    """‖y_new − y_old‖ / (span · max(1, ‖y_new‖)) for y = (M, Q, a, b) flattened."""
    y_old, y_new = _flat(old), _flat(new)
    return float(np.linalg.norm(y_new - y_old) / (span * max(1.0, np.linalg.norm(y_new))))


@dataclass
class RunSettings:
    """Everything that defines an E∞ run except the initial condition.

    The ODE runs until ``rule`` says the state has left the plateau and its speed falls
    steadily (or until ``rule.T_max``); then, with ``solve``, the fixed point is solved for
    and certified (:mod:`theory_kit.asymptotic.fixedpoint`): gradient flow on a Sobol-point objective
    of ``solver_points`` points (seed ``solver_seed``; token noise importance-sampled with
    mixture weight ``solver_tilt``, see ``SampledError``; None: :func:`auto_tilt`), finite γ
    as a root of the ODE's own
    fixed-sample drift; ``drift_tol`` is the certificate's drift threshold; ``max_escapes``
    saddles may be passed.  With ``shift_check`` the fixed point is solved again on an
    independent sample set to measure the shift of E (``EinfRun.sample_shift``).  In gradient
    flow the descent from the hand-over runs first on the first 1/``solver_coarse`` of the
    points (their leading Sobol points, at least 256; 1: off), then the full set polishes and
    certifies (``fixedpoint.solve_gradient_flow``'s ``coarse``).  A gradient-flow
    solution whose sampled E disagrees with the precise E is solved again with 4x the points,
    up to ``solver_refine`` times (:func:`solve_checked`).  ``polish="pairwise"`` (gradient
    flow, where a deterministic E exists, :func:`polish_applies`; ``"per-head"``: only where
    the pairwise decomposition does) then
    polishes and certifies the solution on the deterministic E (:func:`polish_pairwise`),
    whose value and abs_err become the run's E (``error_method`` "deterministic" gives the
    same engine's E without the polish).

    ``flow`` is how the state gets to the hand-over: ``ode`` integrates the order-parameter ODE
    on the drift engine ``drift`` (``n_samples`` draws); ``sampled`` (gradient flow only)
    integrates the same gradient flow dK/dτ = −½ ∂E/∂K (and −½ ∂E/∂b, ∂E/∂a for trained
    scalars) on K = [M | P] with E the solver's objective (:func:`flow_objective`).  The two are one
    flow (Q = K Kᵀ, M = K[:, :F]) with different estimates of the expectations; ``sampled`` needs
    only the sample kernels the solver compiles anyway, not the drift kernels (≈ 15–30 s of
    numba compilation per activation, the dominant cost of a short cold run)."""

    gamma: float = 1.0
    gradient_flow: bool = False
    rule: StopRule = field(default_factory=StopRule)
    method: str = "solve_ivp"
    dt: float = 0.1
    rtol: float = 1e-5
    atol: float = 1e-8
    n_samples: int = 4000
    mc_seed: int = 0
    error_method: str = "auto"
    error_samples: int = 400_000
    drift: str = "mc"
    solve: bool = True
    solver_points: int = 2 ** 14
    solver_seed: int = 0
    solver_sampling: str = "sobol"
    solver_tilt: float | None = None
    drift_tol: float = 1e-8
    max_escapes: int = 4
    shift_check: bool = True
    solver_refine: int = 2
    solver_coarse: int = 4
    flow: str = "ode"
    polish: str = "none"

    def __post_init__(self) -> None:
        for name in ("gamma", "dt", "rtol", "atol", "drift_tol"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                fail(name, "must be a finite number > 0", value)
        if self.method not in ODE_METHODS:
            fail("method", f"must be one of {', '.join(ODE_METHODS)}", self.method)
        if self.error_method not in PRECISE_METHODS:
            fail("error_method", f"must be one of {', '.join(PRECISE_METHODS)}",
                 self.error_method)
        check_int(self.n_samples, "samples", 2)
        check_int(self.error_samples, "error_samples", 2)
        check_int(self.solver_points, "solver_points", 16)
        check_int(self.max_escapes, "max_escapes", 0)
        check_int(self.solver_refine, "solver_refine", 0)
        check_int(self.solver_coarse, "solver_coarse", 1)
        if self.drift not in ENGINES:
            fail("drift", f"must be one of {', '.join(ENGINES)}", self.drift)
        if self.flow not in FLOWS:
            fail("flow", f"must be one of {', '.join(FLOWS)}", self.flow)
        if self.flow == "sampled" and not self.gradient_flow:
            fail("flow", "'sampled' integrates gradient flow only (needs gradient_flow=True)",
                 self.flow)
        if self.polish not in POLISH:
            fail("polish", f"must be one of {', '.join(POLISH)}", self.polish)
        if self.polish != "none" and not self.gradient_flow:
            fail("polish", "the deterministic polish minimises E (needs gradient_flow=True)",
                 self.polish)
        if self.solver_sampling not in POINTS:
            fail("solver_sampling", f"must be one of {', '.join(POINTS)}", self.solver_sampling)

    def engine(self, task: Task | None = None, act: Activation | None = None,
               H: int | None = None) -> DriftEngine:
        """The drift engine ``drift`` from ``expect.engines.build_engine``: fixed Monte Carlo
        samples (``mc``, ``n_samples`` draws) or quadrature nodes (``quad``, the default
        number of Sobol points); ``laplace`` and ``auto`` need the task, activation and H."""
        samples = self.n_samples if self.drift == "mc" else DEFAULT_QMC_POINTS
        return build_engine(self.drift, task, act, H, samples=samples, seed=self.mc_seed)

    def params(self) -> dict:
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "rule"},
                "rule": self.rule.params(),
                "time_unit": "gamma*t (gradient flow)" if self.gradient_flow else "t"}


def run_to_convergence(task: Task, act: Activation, ic: InitialCondition,
                       settings: RunSettings, out: str | None = None,
                       progress: bool = True) -> EinfRun:
    """Integrate from ``ic`` until ``settings.rule`` hands over, solve and certify the fixed
    point (``settings.solve``), then E there.

    The ODE (``ode.integrate_ode``; fixed Monte Carlo samples or quadrature nodes, so the
    right-hand side is smooth and its fixed points are well defined) runs chunk by chunk;
    in the gradient-flow limit the γ² term is dropped and the clock is τ = γ t.  The solver
    (:func:`solve_fixed_point`) starts from the last state; E at its solution comes from
    :func:`precise_error` (``auto``: quadrature) with its error estimate.  With ``out``
    the finished run is written there and the progress after every chunk is checkpointed
    next to it, so an interrupted run resumes."""
    params = run_params(task, act, ic, settings)
    if out is not None and (done := _stored_run(out, params)) is not None:
        return done
    checkpoint = Checkpoint(out) if out is not None else None
    saved = checkpoint.load(params) if checkpoint else None
    state, t = ic.state, 0.0
    hist: dict = {"t": [0.0], "error_ode": [], "speed": []}
    if saved:
        state, t, hist = State(**saved["state"]), saved["t"], saved["history"]
    rule = settings.rule
    engine = None if settings.flow == "sampled" else settings.engine(task, act, ic.state.H)
    advance = (SampledFlow(flow_objective(task, act, ic.state.H, settings), settings)
               if engine is None else
               lambda st, span: _advance(task, act, st, span, settings, engine))
    bar = (progress_bar(rule.T_max, f"einf seed {ic.seed}", unit="t", initial=t)
           if progress else None)
    try:
        while t < rule.T_max and not rule.converged(t, hist["speed"]):
            span = min(rule.chunk, rule.T_max - t)
            try:
                new, error_ode = advance(state, span)
            except BoundaryError as err:
                if not (settings.gradient_flow and settings.solve):
                    raise
                # A fixed-sample drift's error along a vanishing direction of Q − M Mᵀ does not
                # vanish with it, so the sampled ODE can reach the PSD boundary in finite time,
                # where the exact flow only tends to it (P → 0 at a minimum of E).  The solver
                # works on K = [M | P], where that boundary is not an edge: it takes over here.
                hist["early_handover"] = {"t": t, "reason": str(err)}
                break
            speed = relative_speed(state, new, span)
            state, t = new, t + span
            for key, val in (("t", t), ("error_ode", error_ode), ("speed", speed)):
                hist[key].append(val)
            if bar is not None:
                bar.update(span)
            if checkpoint:
                checkpoint.save(params, {"state": state.to_dict(), "t": t, "history": hist})
    finally:
        if bar is not None:
            bar.close()
    fixed, shift = None, float("nan")
    hist["ode_end"] = state.to_dict()   # where the solver took over
    if settings.solve:
        fixed, final, used = solve_checked(task, act, state, settings, engine)
        state = fixed.state
        hist["solver_points"] = used.solver_points
        if settings.shift_check and fixed.presolve is None:   # a polished point has no samples
            shift = sample_shift(task, act, fixed, used)
    else:
        final = precise_error(task, act, state, settings.error_method, settings.error_samples)
    ok = fixed.certificate.certified if fixed is not None else rule.converged(t, hist["speed"])
    run = EinfRun(int(ic.seed or 0), state, final, t, ok, hist["speed"], hist,
                  rule.tail(hist["speed"]), fixed, shift)
    if out is not None:
        write_json(out, {"params": params, "run": run.to_dict()})
        checkpoint.clear()
    return run


def solve_checked(task: Task, act: Activation, start: State, settings: RunSettings,
                  engine: DriftEngine | None = None
                  ) -> tuple[FixedPoint, ErrorValue, RunSettings]:
    """The fixed point from ``start`` (:func:`solve_fixed_point`), E there by the precise
    engine, and the settings finally used.

    In gradient flow the solver's sampled E at its solution is compared with the precise E
    (:func:`fixedpoint.check_objective`).  Where they disagree the sample set was one the keys
    could separate (rare events at strong signal): the solve is repeated from ``start`` with
    4x the solver points, up to ``settings.solver_refine`` times; if it still disagrees the
    certificate says "objective unreliable".  A solve that ends at a saddle it could not leave
    is repeated once with 4x the points too (when ``solver_refine`` ≥ 1): measured at F = 4,
    ν = 10, H = 4, B-softmax on 2^11–2^12 points ran off to large keys on a sample-fitting
    saddle (E_n below the true E by 1.5e-3) that 4x the points do not have.  A run-off ("keys
    diverge") is solved again on 4x the points at every attempt (the fitting it comes from
    recedes as the points grow: softmax at F = 4, ν = 10, H = 4 ran off on 2^14 tilted points
    and certifies a bounded minimum on 2^15 plain ones); one still running off at the last
    attempt is checked on a held-out point set (:func:`fixedpoint.runoff_check`, stored as the
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
        fixed = solve_fixed_point(task, act, start, used, engine, key_bound=key_bound)
        if polish:      # the polish takes the sampled point or, after a run-off, the hand-over
            break       # (polish_pairwise): no precise E there, no re-solve on more points
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
        check = held_out_runoff_check(task, act, start, fixed.state, used)
        fixed = dataclasses.replace(fixed, runoff=check.to_dict())
    if polish:
        fixed, final = polish_pairwise(task, act, start, fixed, settings.drift_tol)
    return fixed, final, used


def held_out_runoff_check(task: Task, act: Activation, start: State, end: State,
                          settings: RunSettings) -> RunoffCheck:
    """:func:`fixedpoint.runoff_check` of a run-off from ``start`` to ``end`` on the held-out
    point set of ``settings``' solver objective (seed offset ``HELD_OUT``)."""
    held_out = solver_objective(task, act, start.H, settings, offset=HELD_OUT)
    return runoff_check(held_out, held_out.pack_state(end), held_out.pack_state(start))


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
    """Whether the deterministic pairwise engine covers (task, act, H) (:func:`pairwise_activation`)."""
    return pairwise_activation(task, act, H) is not None


def polish_applies(task: Task, act: Activation, H: int, mode: str = "pairwise") -> bool:
    """Whether the polish ``mode`` (:data:`POLISH`) has a deterministic E for (task, act, H)
    (:func:`deterministic_objective`): "pairwise" any, "per-head" the pairwise
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
    (:func:`polish_from_sampled`): ``fixedpoint.RUNOFF_GROWTH`` × max(1, the hand-over's)."""
    return RUNOFF_GROWTH * max(1.0, largest_key_norm(start))


def polish_from_sampled(start: State, sampled: FixedPoint) -> bool:
    """Whether the polish starts from the sampled solution (else from the hand-over
    ``start``): only from a certified one whose largest key norm stays within
    ``fixedpoint.RUNOFF_GROWTH`` × max(1, the hand-over's).  A sampled descent that fitted its
    points ends far out without running off past ``runoff_bound`` (softmax, F = 4, ν = 10,
    H = 8 on 2^15 points: heads at |k| ≈ 600–900 against ≈ 1.6 at the hand-over), where the
    Laplace grids of a pair grow without bound (measured: a polish started there was killed
    at 20 GB); with the precise-E check of the sampled point skipped, its certificate and
    key norms are all there is to go by."""
    if not sampled.certificate.certified:
        return False
    return largest_key_norm(sampled.state) <= polish_key_bound(start)


def polish_pairwise(task: Task, act: Activation, start: State, sampled: FixedPoint,
                    tol: float) -> tuple[FixedPoint, ErrorValue]:
    """The sampled solver's fixed point polished and certified on the deterministic E
    (:func:`fixedpoint.polish_gradient_flow` on :func:`deterministic_objective`: the pairwise
    decomposition, or the drift engine's E for a joint normaliser with H ≤ 3): from the
    sampled solution, or from the hand-over ``start`` when that is not certified or far out
    (:func:`polish_from_sampled`: a run-off or a sample artefact).  The sampled solve is kept in the result's
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
    return fixed, ErrorValue(fixed.sampled_error, float(fixed.error_abs_err),
                              "laplace pairs" if isinstance(obj, PairwiseError) else obj.n,
                              {"level": obj.level})


def _polish_to_the_boundaries(obj, origin: State, tol: float) -> FixedPoint:
    """:func:`fixedpoint.polish_gradient_flow` from ``origin``; uncertified, on the pairwise
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


def solver_objective(task: Task, act: Activation, H: int, settings: RunSettings,
                     offset: int = 0) -> SampledError:
    """The gradient-flow solver's objective (seed ``solver_seed + offset``)."""
    return SampledError.for_activation(task, act, H, n=settings.solver_points,
                                       seed=settings.solver_seed + offset,
                                       points=settings.solver_sampling,
                                       tilt=(auto_tilt(task, act) if settings.solver_tilt is None
                                             else settings.solver_tilt))


def auto_tilt(task: Task, act: Activation) -> float:
    """0.3 when the signal is strong (E[|θ|²] ≥ 10) and the activation has Bayes offsets (it
    can reach the Bayes posterior, and then its excess E − E_Bayes is a rare-event average),
    else 0.  Measured at F = 4, ν = 10, H = 4 (standard error of the sampled E on 2^12 points
    at the previous session's end points, plain / tilted): B-softmax 2.4e-4 / 8.4e-5 (the
    tilt helps 3x), softmax-1 1.4e-3 / 1.6e-3, softmax 4.0e-3 / 5.5e-3 (the tilt only adds
    variance: softmax ran off on 2^14 tilted points, and on 2^16 its tilted minimum lies at
    E = 0.062201 by quadrature against 0.062109 for the plain one).  At ν = 2 the tilt's weights
    only add variance for every activation (B-softmax's minimiser excess at 2^15 points 1.6e-5
    tilted against 1.2e-5 plain)."""
    bayes_like = act.offset == "bayes"
    strong = float(np.sum(task.prior.second_moments())) >= 10.0
    return 0.3 if strong and bayes_like else 0.0


def solve_fixed_point(task: Task, act: Activation, state: State, settings: RunSettings,
                      engine: DriftEngine | None = None, offset: int = 0,
                      key_bound: float = np.inf) -> FixedPoint:
    """The certified fixed point reached from ``state``.

    Gradient flow: :func:`fixedpoint.solve_gradient_flow` on :func:`solver_objective` (its
    descent stopped where a key norm passes ``key_bound``).
    Finite γ: :func:`fixedpoint.solve_drift_root` on the full drift of ``engine`` (the
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


def _advance(task: Task, act: Activation, state: State, span: float, settings: RunSettings,
             engine: SampleDrift) -> tuple[State, float]:
    """Integrate one chunk; (state at its end, the ODE engine's E there)."""
    traj = integrate_ode(task, act, InitialCondition(state), settings.gamma, span,
                         times=[0.0, span], method=settings.method, dt=settings.dt,
                         engine=engine, gradient_flow=settings.gradient_flow,
                         rescale_time=settings.gradient_flow, rtol=settings.rtol,
                         atol=settings.atol, progress=False)
    end = admissible_state(traj.M[-1], traj.Q[-1], traj.a[-1], traj.b[-1])
    return end, float(traj.error[-1])


def flow_objective(task: Task, act: Activation, H: int, settings: RunSettings) -> SampledError:
    """The sampled gradient flow's E: the solver's own objective (same points), so the flow
    hands over a point on the descent path of the very function the solver minimises.
    Measured on Fig. 4 quick: this flow handed 2 of 12 runs (B-softmax F = 4, H = 2; softmax-1
    F = 2, ν = 8) over to saddles the solver did not leave, the ``ode`` flow none, so Fig. 4
    keeps ``ode``; on 100 points of its own (seed apart) it was 1 of 12."""
    return solver_objective(task, act, H, settings)


class SampledFlow:
    """Gradient flow on x = (K, trained a, b) of a :class:`SampledError`:

        dx/dτ = −½ ∂E_n/∂x,

    which is the order-parameter ODE of docs/theory.md §5 without the γ² term (clock τ = γ t,
    γ_a = γ_b = γ): with k_h ∈ R^D moving by −(γ/D)∇ ½(y − ŷ)², the keys' components in the
    span of U and the keys themselves move by −½ ∂E/∂K, and M = K[:, :F], Q = K Kᵀ follow.
    Integrated by ``solve_ivp`` (RK45 at the settings' rtol, atol).  Called with the state it
    returned last, it continues from its own x (re-factorising Q − M Mᵀ would rotate P, and
    the sampled E is gauge invariant only as n → ∞)."""

    def __init__(self, obj: SampledError, settings: RunSettings) -> None:
        self.obj, self.settings = obj, settings
        self.last: tuple[State, np.ndarray] | None = None

    def rate(self, _t: float, x: np.ndarray) -> np.ndarray:
        return -0.5 * self.obj.value_and_grad(x)[1]

    def __call__(self, state: State, span: float) -> tuple[State, float]:
        """(state after ``span`` time units, sampled E there)."""
        x0 = self.last[1] if self.last is not None and self.last[0] is state else \
            self.obj.pack_state(state)
        sol = integrate.solve_ivp(self.rate, (0.0, span), x0, method="RK45",
                                  rtol=self.settings.rtol, atol=self.settings.atol)
        if not sol.success:
            fail("flow", "the sampled gradient flow failed (" + sol.message + ")", "sampled")
        x = sol.y[:, -1]
        end = self.obj.state(x)
        self.last = (end, x)
        return end, float(self.obj.value_and_grad(x)[0])


def run_params(task: Task, act: Activation, ic: InitialCondition,
               settings: RunSettings) -> dict:
    """Everything that fixes a run of :func:`run_to_convergence` (stored with its result)."""
    return {"task": task.params(), "activation": act.params(), "initial": ic.params(),
            "settings": settings.params()}


def _stored_run(out: str | Path, params: dict) -> EinfRun | None:
    """The finished run in ``out`` when it holds these params and was written by this code
    (``results.read_piece``: an unreadable or other-code file is set aside), else None."""
    data = read_piece(Path(out))
    if data is None or data.get("params") != to_jsonable(params):
        return None
    return EinfRun.from_dict(data["run"])


# ----------------------------------------------------------------------------- Bayes floor
def bayes_floor(task: Task, method: str = "auto", mc_samples: int = 400_000,
                seed: int = 12345) -> ErrorValue:
    """E_Bayes of the task (``error.bayes_error``); with ``mc``, ``mc_samples`` draws;
    ``deterministic`` is ``auto`` (quadrature) here."""
    if method == "mc":
        return bayes_error(task, method="mc", n=mc_samples, seed=seed)
    return bayes_error(task, method="auto" if method == "deterministic" else method)


def bayes_excess(task: Task, act: Activation, state: State, n: int = 400_000,
                 seed: int = 4242, chunk: int = 20_000) -> ErrorValue:
    """E(state) − E_Bayes by Monte Carlo on paired samples, with its standard error.

    The Bayes posterior p_l = P(ε = l | X) ∝ g(Uᵀx_l) is the conditional mean of the one-hot
    target, so for any weights w that are functions of X

        E − E_Bayes = E‖ẽ − w‖² − E‖ẽ − p‖² = E‖w − p‖² ≥ 0,

    an average of a non-negative quantity that vanishes where w = p.  Near the Bayes point its
    variance is tiny, unlike that of E and E_Bayes estimated apart (at F = 4, ν = 10 each is a
    rare-event average with a relative error of a few percent at 4·10⁵ draws).  Tokens live
    in R^{F+H} (keys K = [M | P], P Pᵀ = Q − M Mᵀ), the first F coordinates being Uᵀx; θ is
    stratified as in ``expect.montecarlo``; ``chunk`` draws at a time bound the memory."""
    check_int(n, "n", 2)
    F, H, L = task.F, state.H, task.L
    K = np.hstack([state.M, state.orthogonal_factor()])
    kernels = sample_kernels(act)
    rng = np.random.default_rng(seed)
    means, errs, done = [], [], 0
    while done < n:
        m = min(chunk, n - done)
        smp = mc.draw_samples(task.prior, F + H, L, m, rng)
        tokens = smp.g.copy()
        tokens[:, :F, 0] += smp.theta
        S = np.matmul(K, tokens)
        w = kernels.weights(S, state.b, np.diag(state.Q), state.a)[3]
        p = bayes_posterior(task.prior, tokens[:, :F, :])
        mean, se = mc.weighted_mean(smp, np.sum((w - p) ** 2, axis=-1))
        means.append(m * float(mean))
        errs.append(m * float(se))
        done += m
    return ErrorValue(float(sum(means) / n), float(np.sqrt(np.sum(np.square(errs))) / n),
                       "mc paired with the Bayes posterior", {"n_samples": n, "seed": seed})


# ----------------------------------------------------------------------------- E∞ of many runs
@dataclass(frozen=True)
class EinfResult:
    """E∞ over several runs, grouped by end point, with the floors alongside."""

    runs: list[EinfRun]
    groups: list[list[int]]
    bayes: ErrorValue | None
    minimum: MinimumResult | None
    params: dict

    @property
    def mean(self) -> float:
        return float(np.mean([r.error.value for r in self.runs]))

    @property
    def abs_err(self) -> float:
        """Numerical error of the mean from the per-run errors of E at the fixed points:
        the evaluation's error combined with each run's measured sample shift
        (``EinfRun.abs_err_total``).  It is not the spread of the runs (reported apart), nor
        does the shift estimate include the bias of the solver's objective that is common to
        independent sample sets (at a minimum any shift raises E, by O(1/n))."""
        return float(np.sqrt(np.sum([r.abs_err_total ** 2 for r in self.runs])) / len(self.runs))

    @property
    def abs_err_reason(self) -> str | None:
        """None when every run is certified (``abs_err`` finite), else which runs are not."""
        bad = [r.seed for r in self.runs if not r.converged]
        if not bad:
            return None
        return (f"runs with seed {', '.join(map(str, bad))} not certified: the mean includes "
                "E at points that are not certified fixed points, so it has no error bar")

    def to_dict(self) -> dict:
        values = [r.error.value for r in self.runs]
        best = self.runs[int(np.argmin(values))]
        group_of = {i: k for k, g in enumerate(self.groups) for i in g}
        runs = [{**r.to_dict(), "group": group_of[i]} for i, r in enumerate(self.runs)]
        out = {"einf": self.mean, "einf_runs": values, "abs_err": self.abs_err,
               "abs_err_reason": self.abs_err_reason,
               "einf_std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
               "converged": [r.converged for r in self.runs],
               "certified": [r.converged for r in self.runs],
               "groups": [{"runs": g, "einf": float(np.mean([values[i] for i in g])),
                           "M": self.runs[g[0]].state.M, "Q": self.runs[g[0]].state.Q}
                          for g in self.groups],
               "M": best.state.M, "Q": best.state.Q, "a": best.state.a, "b": best.state.b,
               "gamma": self.params["settings"]["gamma"],
               "gradient_flow": self.params["settings"]["gradient_flow"],
               "bayes": None if self.bayes is None else self.bayes.value,
               "bayes_abs_err": None if self.bayes is None else self.bayes.abs_err,
               "global_min": None if self.minimum is None else self.minimum.error.value,
               "global_min_abs_err": None if self.minimum is None else self.minimum.error.abs_err,
               "runs": runs, "params": self.params}
        return to_jsonable(out)


def _one_run(job: tuple) -> EinfRun:
    task, act_params, ic, settings, out, progress = job
    if out is not None and not writable_folder(Path(out).parent):
        out = None   # a remote worker without the caller's disk: no checkpoints inside the run
    # rebuilt here: an activation's cached NumPy callables do not pickle to worker processes
    return run_to_convergence(task, activation_from_params(act_params), ic, settings, out=out,
                              progress=progress)


def writable_folder(folder: Path) -> bool:
    """Whether ``folder`` exists or can be created, and is writable."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


@dataclass(frozen=True)
class RunFiles:
    """The sweep store of :func:`asymptotic_error`: a finished run is ``run_<seed>.json`` in
    the work folder, the file :func:`run_to_convergence` writes (``{"params", "run"}``), and
    counts only when it was made with the same parameters."""

    folder: Path
    params: dict            # key -> run_params of that run

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def load(self, key: str) -> EinfRun | None:
        return _stored_run(self.path(key), self.params[key])

    def save(self, key: str, run: EinfRun) -> EinfRun:
        write_json(self.path(key), {"params": self.params[key], "run": run.to_dict()})
        return EinfRun.from_dict(read_json(self.path(key))["run"])


def asymptotic_error(task: Task, act: Activation, H: int, settings: RunSettings,
                     runs: int = 5, D: int = 10_000, eta: float = 1.0, seed: int = 0,
                     workdir: str | Path | None = None, jobs: int = 1,
                     with_bayes: bool = True, with_minimum: bool = False,
                     minimum_starts: int = 8, progress: bool = True,
                     executor: object | None = None) -> EinfResult:
    """E∞ from ``runs`` initialisations drawn at dimension D (seeds seed, seed+1, …).

    Each run is :func:`run_to_convergence`, one piece of a sweep (``executor.run_sweep``):
    ``jobs`` local processes, or ``executor`` (a ``concurrent.futures.Executor`` or a
    ``distributed.Client``).  With a ``workdir`` each finished run is a file there
    (``run_<seed>.json``, plus a checkpoint inside a run) so a stopped call resumes.  The
    runs are grouped by end point (:func:`group_runs`).  Optionally the Bayes error and the
    global minimum of E (started also from the runs' end points) come along."""
    check_int(runs, "runs", 1)
    check_int(jobs, "jobs", 1)
    wd = None if workdir is None else Path(workdir).absolute()
    inside = progress and runs_in_process(executor, jobs, runs)
    jobs_list, keys, params = [], [], {}
    for r in range(runs):
        ic = InitialCondition.draw(act, H, task.F, task.L, D, eta, seed + r)
        key = f"run_{seed + r}"
        out = None if wd is None else str(wd / f"{key}.json")
        jobs_list.append((task, act.params(), ic, settings, out, inside))
        keys.append(key)
        params[key] = run_params(task, act, ic, settings)
    store = None if wd is None else RunFiles(wd, params)
    results = map_jobs(_one_run, jobs_list, jobs, desc=f"einf {act.name} H={H}",
                       executor=executor, keys=keys, store=store)
    groups = group_runs([r.state for r in results], [r.error for r in results], task.prior)
    bayes = bayes_floor(task, settings.error_method, settings.error_samples) if with_bayes else None
    minimum = (global_minimum(task, act, H, n_starts=minimum_starts, seed=seed,
                              extra_starts=[r.state for r in results],
                              method=settings.error_method) if with_minimum else None)
    params = {"task": task.params(), "activation": act.params(), "H": H, "runs": runs, "D": D,
              "eta": eta, "seed": seed, "settings": settings.params()}
    return EinfResult(results, groups, bayes, minimum, params)


def map_jobs(fn: Callable, items: list, jobs: int, desc: str = "jobs",
             executor: object | None = None, keys: list[str] | None = None,
             store: object | None = None) -> list:
    """[fn(x) for x in items] as one sweep (:func:`theory_kit.io.executor.run_sweep`): ``jobs``
    local processes or ``executor``; with a ``store`` (and stable ``keys``) finished items
    are kept and skipped on a rerun.  One progress bar counting items."""
    return run_sweep(fn, items, keys if keys is not None else range(len(items)), store=store,
                     executor=executor, jobs=jobs, desc=desc, unit="run")


def _run_status(run: dict) -> str:
    """How a run ended, in words: certificate or stop rule."""
    if run["certified"] is None:
        return f"at T = {run['T']:g}" + ("" if run["converged"] else "  NOT CONVERGED")
    kind = run["kind"] + (f": {run['runoff_verdict']}" if run.get("runoff_verdict") else "")
    verdict = "certified " + kind if run["certified"] else f"NOT CERTIFIED ({kind})"
    saddles = f", {run['saddles_passed']} saddle(s) passed" if run["saddles_passed"] else ""
    early = (" (early: the sampled ODE reached the PSD boundary)"
             if run.get("history", {}).get("early_handover") else "")
    return (f"{verdict}: drift {run['drift_norm']:.1e}, min eigenvalue "
            f"{run['min_eigenvalue']:.2g}{saddles}; solver from T = {run['T']:g}{early}")


def _plus_minus(abs_err: float | None) -> str:
    """'+/- err', or the absence of an error bar said in words (uncertified runs)."""
    return UNKNOWN_ERROR if abs_err is None else f"+/- {abs_err:.2g}"


def summary(result: EinfResult) -> str:
    """A few lines for people: E∞ per run and group, the floors, γ."""
    d = result.to_dict()
    mode = "gradient flow" if d["gradient_flow"] else f"gamma = {d['gamma']:g}"
    lines = [f"E_inf = {d['einf']:.6g} {_plus_minus(d['abs_err'])} (mean of "
             f"{len(d['einf_runs'])} runs, spread {d['einf_std']:.2g}; {mode})"]
    for run in d["runs"]:
        lines.append(f"  run seed {run['seed']}: {run['einf']:.6g} {_plus_minus(run['abs_err'])} "
                     f"{_run_status(run)}")
    if len(d["groups"]) > 1:
        lines.append(f"  {len(d['groups'])} different end points: " + "; ".join(
            f"runs {g['runs']} -> {g['einf']:.6g}" for g in d["groups"]))
    if d["global_min"] is not None:
        lines.append(f"global minimum of E = {d['global_min']:.6g} "
                     f"+/- {d['global_min_abs_err']:.2g}")
    if d["bayes"] is not None:
        lines.append(f"E_Bayes = {d['bayes']:.6g} +/- {d['bayes_abs_err']:.2g}")
    return "\n".join(lines)
