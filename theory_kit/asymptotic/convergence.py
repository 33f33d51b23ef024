"""How an E∞ run gets to its hand-over: the settings, the stop rule and the flow
(docs/theory.md §5, §6).

The ODE of docs/theory.md §5 is integrated in chunks (:func:`_advance`) from a finite-D
initialisation until the state stops moving (:class:`StopRule`).  After each chunk of length
Δt the relative speed of y = (M, Q, a, b) is recorded,

    v_k = ‖y(t_k) − y(t_{k−1})‖ / (Δt · max(1, ‖y(t_k)‖))        (:func:`relative_speed`),

and the run hands over to the solver when the speeds have fallen at every chunk of a window,
with ratio r < 1 and a geometric tail v_k Δt r / (1 − r) below the tolerance.  At finite γ
the γ² term keeps pumping noise into the keys, so E∞(γ) sits above the minimum gradient flow
reaches; ``gradient_flow=True`` drops that term (time τ = γ t), and the flow to the hand-over
can then also be the sampled gradient flow dK/dτ = −½ ∂E_n/∂K on the solver's own points
(:class:`SampledFlow`).  :class:`RunSettings` holds everything that defines a run except its
initial condition, and :func:`solver_objective` builds the solver's sampled objective from it.

See Also
--------
theory_kit.asymptotic.solve : the fixed point solved for at the hand-over.
theory_kit.asymptotic.runs : a run from start to E∞ (``run_to_convergence``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from scipy import integrate

from ..dynamics.ode import METHODS as ODE_METHODS
from ..dynamics.ode import integrate_ode
from ..expect.drift import ENGINES
from ..expect.engines import DEFAULT_QMC_POINTS, DriftEngine, build_engine
from ..expect.error import METHODS as ERROR_METHODS
from ..model.activations import Activation
from ..model.initial import InitialCondition
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int, fail
from .objectives import POINTS, SampledError

FLOWS = ("ode", "sampled")
# RunSettings.polish: the deterministic solve after the sampled one — "pairwise" wherever a
# deterministic E exists (:func:`solve.polish_applies`), "per-head" only on the pairwise
# decomposition (not the drift engine's E of a joint normaliser at H = 2, 3: ~130 CPU s per
# evaluation of E and its gradient at F = 4, ν = 10, L = 5, H = 2, measured; 11 evaluations
# in 24 CPU min, so a polish of ~100 would take hours)
POLISH = ("none", "pairwise", "per-head")
PRECISE_METHODS = ERROR_METHODS + ("deterministic",)   # solve.precise_error's methods


# ----------------------------------------------------------------------------- stop rule
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
    return float(np.linalg.norm(y_new - y_old)
                 / (span * max(1.0, float(np.linalg.norm(y_new)))))


# ----------------------------------------------------------------------------- settings
@dataclass
class RunSettings:
    """Everything that defines an E∞ run except the initial condition.

    The ODE runs until ``rule`` says the state has left the plateau and its speed falls
    steadily (or until ``rule.T_max``); then, with ``solve``, the fixed point is solved for
    and certified (:mod:`theory_kit.asymptotic.solve`): gradient flow on a Sobol-point objective
    of ``solver_points`` points (seed ``solver_seed``; token noise importance-sampled with
    mixture weight ``solver_tilt``, see ``objectives.SampledError``; None: :func:`auto_tilt`),
    finite γ as a root of the ODE's own
    fixed-sample drift; ``drift_tol`` is the certificate's drift threshold; ``max_escapes``
    saddles may be passed.  With ``shift_check`` the fixed point is solved again on an
    independent sample set to measure the shift of E (``runs.EinfRun.sample_shift``).  In
    gradient flow the descent from the hand-over runs first on the first 1/``solver_coarse`` of
    the points (their leading Sobol points, at least 256; 1: off), then the full set polishes
    and certifies (``gradient_flow.solve_gradient_flow``'s ``coarse``).  A gradient-flow
    solution whose sampled E disagrees with the precise E is solved again with 4x the points,
    up to ``solver_refine`` times (:func:`solve.solve_checked`).  ``polish="pairwise"``
    (gradient flow, where a deterministic E exists, :func:`solve.polish_applies`;
    ``"per-head"``: only where the pairwise decomposition does) then polishes and certifies
    the solution on the deterministic E (:func:`solve.polish_pairwise`),
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


# ----------------------------------------------------------------------------- the flow
def _advance(task: Task, act: Activation, state: State, span: float, settings: RunSettings,
             engine: DriftEngine) -> tuple[State, float]:
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
