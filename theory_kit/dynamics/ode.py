"""Integration of the order-parameter ODEs of online SGD (docs/theory.md §5).

With the drift expectations of the engines of ``expect`` (E[·] over θ and the scores):

    dM/dt = γ E[dM],      dQ/dt = γ E[dQ_lin] + γ² E[dQ_noise],
    da/dt = γ_a E[da] (a trained),   db/dt = γ_b E[db] (b trained),

with γ_a = γ_b = γ by default and the trained flags taken from the activation.  In the
gradient-flow mode the γ² noise term is dropped; with ``rescale_time`` the clock is
τ = γ t (so the rates are divided by γ and γ → 0 is a well-defined limit).

Integrators:

* ``rk4``: fixed-step classical Runge–Kutta, steps of at most ``dt`` that land exactly on the
  requested times; a checkpoint every ``checkpoint_every`` steps.
* ``rk45`` / ``dop853`` (``solve_ivp`` is ``rk45``): adaptive embedded Runge–Kutta pairs of
  SciPy (Dormand–Prince 5(4) and 8(5,3)) stepped one step at a time over the whole span
  [0, T] with the local-error control |err_i| ≤ atol + rtol |y_i|.  The requested times are
  read off each step's dense-output interpolant (4th / 7th order), so they never shorten a
  step; a checkpoint (state, time, next step size and the drift at that state) every
  ``checkpoint_every`` steps, and a resumed run takes exactly the steps of the uninterrupted
  one (the pairs carry no other state: the step size is restored, and the first stage is the
  saved drift, the last stage of the step before, rather than a re-evaluation, which the
  engine need not compute the same way, see ``_AdaptiveRun._resumed_rhs``).
  Adaptive steps need a smooth right-hand side: a deterministic engine, or fixed samples
  (common random numbers); fresh samples are only accepted with ``rk4``.  An engine with a
  per-step convergence check (``laplace``: ``per_step_check``, ``begin_step``) runs it once
  per step instead of at every call.

The integration always starts at t = 0 from the initial condition; ``times`` are where the
trajectory is recorded (the start is in the output only when 0 is requested).  At every
recorded time the population error and the engine's error estimates are recorded from the
same engine: ``error_stderr`` (of E) and ``drift_err`` (the largest error estimate of the
right-hand side dy/dt there: a standard error for Monte Carlo, an absolute error bound for a
deterministic engine, 0 for nodes without an estimate).  At times read off an adaptive step's
interpolant no step reuses a drift, so an engine with an E-only evaluation (``laplace``:
``evaluate_error``) records E from it, and ``drift_err`` there is the largest estimate among
the drifts of the step that covers the time.  ``stats`` counts the right-hand-side
evaluations, the E-only ones and the steps.  A state that is non-finite or whose Q is not positive
semi-definite raises :class:`BlowUpError`, naming the time; so does (:class:`StepError`) a
fixed RK4 step that stops resolving the dynamics (h·λ beyond RK4's stability limit
:data:`MAX_STEP_RATE`, estimated at every step from its own stages, :func:`rk4_stages`), at
whatever time that happens.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from scipy.integrate import DOP853, RK45

from ..expect.drift import DriftMeans, MonteCarloDrift
from ..expect.engines import DriftEngine
from ..io.progress import note, progress_bar
from ..io.results import Checkpoint
from ..model.activations import Activation
from ..model.initial import InitialCondition
from ..model.state import State, check_state_for_task
from ..model.task import Task
from ..model.validation import ValidationError, as_finite_array, check_int, check_psd, fail
from .drift_watch import DriftWatch
from .trajectory import ROW_KEYS, Trajectory

if TYPE_CHECKING:
    from tqdm import tqdm

METHODS = ("rk4", "rk45", "dop853", "solve_ivp")
ADAPTIVE = {"rk45": RK45, "dop853": DOP853, "solve_ivp": RK45}
CHECKPOINT_SECONDS = 10.0  # at most this long between checkpoints of a long run
PSD_BLOWUP_TOL = 1e-7
DIVERGENCE_BOUND = 1e8  # |Q_hh'| beyond this is a divergence, long before overflow
# an adaptive step whose stages leave the admissible set: retry this much smaller
STAGE_RETRY_FACTOR = 0.25
STAGE_RETRY_FLOOR = 1e-9   # ... down to this fraction of max(1, |t|), then the blow-up is the ODE's


class BlowUpError(ValidationError):
    """The integration left the admissible set (non-finite values or Q not PSD) at some time."""


class BoundaryError(BlowUpError):
    """Q lost positive semi-definiteness: the state crossed the boundary of the PSD cone.

    The exact flow cannot cross it (Q is a Gram matrix), so an accepted state there is either
    a step too large (RK4) or an artefact of the drift estimate near the boundary."""


# ----------------------------------------------------------------------------- the system
@dataclass
class OdeSystem:
    """The right-hand side on the flat vector y = (M, Q, a, b) raveled."""

    task: Task
    act: Activation
    engine: DriftEngine
    H: int
    rate: float           # multiplies E[dM], E[dQ_lin]
    noise_rate: float     # multiplies E[dQ_noise] (0 in gradient flow)
    rate_a: float         # 0 when a is fixed
    rate_b: float         # 0 when b is fixed
    evaluations: int = 0
    error_evaluations: int = 0   # E-only evaluations (``error_at``)
    step_err: float = 0.0        # largest ``rhs_error`` of the evaluations since the last reset
    _last: tuple | None = None

    def split(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        H, F = self.H, self.task.F
        i, j = H * F, H * F + H * H
        return (y[:i].reshape(H, F), y[i:j].reshape(H, H), y[j:j + H], y[j + H:j + 2 * H])

    @staticmethod
    def join(M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([M.ravel(), Q.ravel(), a.ravel(), b.ravel()])

    def means(self, t: float, y: np.ndarray, again: bool = False) -> DriftMeans:
        """Drift expectations at y, after checking y is admissible.

        With fixed samples the last result is reused when y repeats (the error recorded at an
        output time and the first stage of the next step share their state), unless ``again``
        (the drift watch tightened the engine)."""
        if not again and self._last is not None and np.array_equal(self._last[0], y):
            return self._last[1]
        M, Q, a, b = self.split(y)
        check_admissible(t, M, Q, a, b, self.noise_rate == 0)
        if self.evaluations == 0:
            self.configure_engine()
        self.evaluations += 1
        result = self.engine.evaluate(self.task, self.act, M, 0.5 * (Q + Q.T), a, b)
        self.step_err = max(self.step_err, self.rhs_error(result))
        if not self.engine.fresh:
            self._last = (y.copy(), result)
        return result

    def configure_engine(self) -> None:
        """Tell an engine with an error target which drifts this system integrates (those of
        M and Q, and of a, b when they are trained)."""
        watch = getattr(self.engine, "watch_fields", None)
        if watch is not None:
            watch(("dM", "dQ_lin") + (("dQ_noise",) if self.noise_rate else ())
                  + (("da",) if self.rate_a else ()) + (("db",) if self.rate_b else ()))

    def engine_accuracy(self) -> dict:
        """The engine's last points and achieved error ({} for engines without a target)."""
        accuracy = getattr(self.engine, "accuracy", None)
        return accuracy() if accuracy is not None else {}

    def engine_exhausted(self) -> bool:
        """Whether an engine with a budget has spent it."""
        return bool(getattr(self.engine, "exhausted", True))

    def error_at(self, t: float, y: np.ndarray) -> tuple[float, float] | None:
        """(E, its error estimate) at y from the engine's E-only evaluation
        (``evaluate_error``), or None when the engine has none or y is the last state
        evaluated (its full result is at hand)."""
        fn = getattr(self.engine, "evaluate_error", None)
        if fn is None or (self._last is not None and np.array_equal(self._last[0], y)):
            return None
        M, Q, a, b = self.split(y)
        check_admissible(t, M, Q, a, b, self.noise_rate == 0)
        self.error_evaluations += 1
        return fn(self.task, self.act, M, 0.5 * (Q + Q.T), a, b)

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        """dy/dt at (t, y): the rates times the drift expectations (module docstring)."""
        return self.rhs_of(self.means(t, y))

    def rhs_of(self, d: DriftMeans) -> np.ndarray:
        """dy/dt from the drift expectations of one evaluation (dQ symmetrised)."""
        dQ = self.rate * d.dQ_lin + self.noise_rate * d.dQ_noise
        return self.join(self.rate * d.dM, 0.5 * (dQ + dQ.T), self.rate_a * d.da,
                         self.rate_b * d.db)

    def rhs_errors(self, d: DriftMeans) -> dict[str, np.ndarray]:
        """Error estimates of dM/dt, dQ/dt, da/dt, db/dt: each field's estimate times its rate,
        the two parts of dQ/dt added (a bound when they are not independent)."""
        se = d.stderr

        def part(name: str, rate: float) -> np.ndarray:
            return abs(rate) * np.abs(np.asarray(se.get(name, 0.0), dtype=float))

        dq = part("dQ_lin", self.rate) + part("dQ_noise", self.noise_rate)
        return {"dM": part("dM", self.rate), "dQ": 0.5 * (dq + dq.T) if np.ndim(dq) == 2 else dq,
                "da": part("da", self.rate_a), "db": part("db", self.rate_b)}

    def rhs_error(self, d: DriftMeans) -> float:
        """The largest error estimate of dy/dt (inf when non-finite)."""
        worst = max(float(np.max(e)) for e in self.rhs_errors(d).values())
        return worst if np.isfinite(worst) else float("inf")


def check_admissible(t: float, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                     b: np.ndarray, gradient_flow: bool = False) -> None:
    """Raise :class:`BlowUpError` at time t on non-finite values, a non-PSD Q
    (:class:`BoundaryError`), or max |Q_hh'| > DIVERGENCE_BOUND.

    In gradient flow γ only sets the clock, so a crossing of the PSD boundary is blamed on
    the drift estimate or the step, not on γ."""
    for name, arr in (("M", M), ("Q", Q), ("a", a), ("b", b)):
        if not np.all(np.isfinite(arr)):
            raise BlowUpError(f"gamma: the integration blew up at t = {t:.6g}: {name} is not "
                              "finite; reduce gamma (or dt)")
    scale = max(1.0, float(np.max(np.abs(Q))))
    if scale > DIVERGENCE_BOUND:
        raise BlowUpError(f"gamma: the integration blew up at t = {t:.6g}: |Q| reached "
                          f"{scale:.3g} > {DIVERGENCE_BOUND:.0e} (diverging); reduce gamma")
    low = float(np.linalg.eigvalsh(0.5 * (Q + Q.T)).min())
    if low >= -PSD_BLOWUP_TOL * scale:
        return
    if gradient_flow:
        raise BoundaryError(f"samples: the gradient flow crossed the PSD boundary at t = {t:.6g}: "
                            f"Q lost positive semi-definiteness (smallest eigenvalue {low:.3g}), "
                            "which the exact flow cannot; a sampled drift's error near the "
                            "boundary carries it across: use more --samples or a deterministic "
                            "--engine (or a smaller --dt with rk4)")
    raise BoundaryError(f"gamma: the integration blew up at t = {t:.6g}: Q lost positive "
                        f"semi-definiteness (smallest eigenvalue {low:.3g}); reduce gamma "
                        "(or dt)")


def rk4_step(system: OdeSystem, t: float, y: np.ndarray, h: float) -> np.ndarray:
    """One classical Runge–Kutta step of size h."""
    return rk4_stages(system, t, y, h)[0]


def rk4_stages(system: OdeSystem, t: float, y: np.ndarray, h: float
               ) -> tuple[np.ndarray, float]:
    """One classical Runge–Kutta step of size h and its stiffness estimate h·λ.

    k₂ − k₁ ≈ (h/2) J k₁ and k₃ − k₂ ≈ (h/2) J (k₂ − k₁), so 2‖k₃ − k₂‖/‖k₂ − k₁‖ ≈ h|λ| for
    the dominant local rate λ of the Jacobian J along the step (Shampine's test, free: no
    extra evaluation).  It is 0 where the stages barely differ (‖k₂ − k₁‖ below
    :data:`STIFFNESS_FLOOR` of ‖k₁‖ or of the state's size per step: the ratio would be
    rounding) and for fresh Monte Carlo samples (the stage differences are sampling noise)."""
    k1 = system.rhs(t, y)
    k2 = system.rhs(t + h / 2, y + h / 2 * k1)
    k3 = system.rhs(t + h / 2, y + h / 2 * k2)
    k4 = system.rhs(t + h, y + h * k3)
    y_new = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    if getattr(system.engine, "fresh", False):
        return y_new, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        d21, d32 = float(np.linalg.norm(k2 - k1)), float(np.linalg.norm(k3 - k2))
        floor = STIFFNESS_FLOOR * max(float(np.linalg.norm(k1)),
                                      max(1.0, float(np.max(np.abs(y)))) / h)
    if not np.isfinite(d21) or not np.isfinite(d32):
        return y_new, float("inf")
    return y_new, (2.0 * d32 / d21 if d21 > floor else 0.0)


# A step is refused where RK4 stops being stable for the local rate: |R(hλ)| > 1 for a
# decaying mode beyond h|λ| = 2.785 on the negative axis (2.83 on the imaginary one), so a mode
# that decays is amplified and the numbers are garbage (unchecked, ode --gamma 1e3 returned
# E(T) = 1.22 where rk45 gives 0.69).  Below it accuracy is the user's choice of dt; the
# figures' quick plans use h|λ| up to 2.5 (Fig. 3 quick, dt = 8, at t = 0) and 2.1 (Fig. 14);
# measured (softmax H = 2, L = 5, mc 2000): h|λ| = 0.97 (gamma 3, dt 2) and 0.18 (gamma 10,
# dt 1) give E(t) within 1e-4 of rk45.
MAX_STEP_RATE = 2.78
STIFFNESS_FLOOR = 1e-7
STIFF_STEPS = 2  # consecutive steps over the limit before refusing (one can be a glitch)


class StepError(ValidationError):
    """A fixed RK4 step too long for the local rates of the dynamics (CLI exit 2)."""


class StepWatch:
    """RK4 steps that refuse to go on when the step does not resolve the dynamics: h·λ of
    :func:`rk4_stages` over :data:`MAX_STEP_RATE` on :data:`STIFF_STEPS` consecutive steps,
    at any time of the run (a trajectory can become stiff long after t = 0)."""

    def __init__(self, system: OdeSystem, option: str = "dt") -> None:
        self.system, self.option, self.strikes = system, option, 0

    def step(self, t: float, y: np.ndarray, h: float) -> np.ndarray:
        """y after one RK4 step of size h from (t, y); raises :class:`StepError`."""
        y_new, rate = rk4_stages(self.system, t, y, h)
        self.strikes = self.strikes + 1 if not rate <= MAX_STEP_RATE else 0
        if self.strikes >= STIFF_STEPS:
            shorter = (f"{self.option} <= {h * MAX_STEP_RATE / rate:.3g}"
                       if np.isfinite(rate) else f"a much smaller {self.option}")
            raise StepError(
                f"{self.option}: the RK4 step {h:.4g} does not resolve the dynamics at "
                f"t = {t:.6g}: h*lambda = {rate:.3g} > {MAX_STEP_RATE:g} (lambda, the fastest "
                f"local rate, grows with gamma = {self.system.rate:g}); allowed: {shorter} "
                "from there on, an adaptive method (rk45), or a smaller gamma")
        return y_new


# ----------------------------------------------------------------------------- validation
def output_times(T: float, times: Sequence[float] | np.ndarray | None, n_times: int = 101
                 ) -> np.ndarray:
    """Requested times: given (non-decreasing, within [0, T]) or n_times evenly spaced on
    [0, T].  The integration starts at t = 0 whatever the first requested time is."""
    T = float(as_finite_array(T, "T"))
    if T <= 0:
        fail("T", "total time must be > 0", T)
    if times is None:
        return np.linspace(0.0, T, n_times)
    arr = np.atleast_1d(as_finite_array(times, "times"))
    if arr.ndim != 1 or arr.size == 0 or np.any(np.diff(arr) < 0) or arr[0] < 0 or arr[-1] > T:
        fail("times", f"must be non-decreasing values in [0, T = {T:g}]", arr)
    return arr


def integration_grid(t_out: np.ndarray) -> tuple[np.ndarray, bool]:
    """The grid stepped through, (0, t_out…) when the first requested time is after the start,
    and whether the start itself is recorded."""
    if t_out[0] > 0:
        return np.concatenate([[0.0], t_out]), False
    return t_out, True


def check_positive(value: float, param: str) -> float:
    """``value`` as a finite float > 0, else the ``param`` error."""
    v = float(as_finite_array(value, param))
    if v <= 0:
        fail(param, "must be > 0", v)
    return v


def build_system(task: Task, act: Activation, H: int, engine: DriftEngine, gamma: float,
                 train_a: bool | None, train_b: bool | None, gamma_a: float | None,
                 gamma_b: float | None, gradient_flow: bool, rescale_time: bool
                 ) -> tuple[OdeSystem, dict]:
    """The ODE system and the resolved rate parameters (for ``params``)."""
    gamma = check_positive(gamma, "gamma")
    gamma_a = gamma if gamma_a is None else check_positive(gamma_a, "gamma_a")
    gamma_b = gamma if gamma_b is None else check_positive(gamma_b, "gamma_b")
    train_a = act.train_a if train_a is None else bool(train_a)
    train_b = act.train_b if train_b is None else bool(train_b)
    if rescale_time and not gradient_flow:
        fail("rescale_time", "only meaningful with gradient_flow=True (tau = gamma t)", True)
    clock = gamma if rescale_time else 1.0
    system = OdeSystem(task, act, engine, H, gamma / clock,
                       0.0 if gradient_flow else gamma ** 2 / clock,
                       gamma_a / clock if train_a else 0.0, gamma_b / clock if train_b else 0.0)
    resolved = {"gamma": gamma, "gamma_a": gamma_a, "gamma_b": gamma_b, "train_a": train_a,
                "train_b": train_b, "gradient_flow": bool(gradient_flow),
                "rescale_time": bool(rescale_time)}
    return system, resolved


# ----------------------------------------------------------------------------- integration
class _Recorder:
    """Rows of the trajectory at the requested times (JSON-friendly for checkpoints)."""

    def __init__(self, rows: dict | None = None) -> None:
        self.rows = rows or {k: [] for k in ROW_KEYS}
        self.watch = DriftWatch()
        self.accuracy: list[dict] = []

    def record(self, system: OdeSystem, t: float, y: np.ndarray, dense: bool = False) -> None:
        """One row at (t, y).  ``dense``: y is read off a step's interpolant, so no step
        reuses a drift there; with an engine that has an E-only evaluation, E comes from it
        (~1/3 of a drift for ``laplace``), and ``drift_err`` is the largest error estimate of
        the drifts the step evaluated (``OdeSystem.step_err``), whose states bracket y."""
        light = system.error_at(t, y) if dense else None
        if light is not None:
            error, error_se, drift_err = light[0], light[1], system.step_err
        else:
            d = self.watch.check(system, t, y, system.means(t, y))
            error, error_se, drift_err = d.error, d.stderr.get("error", 0.0), system.rhs_error(d)
            accuracy = system.engine_accuracy()
            if accuracy:
                self.accuracy.append({"t": float(t), **accuracy})
        M, Q, a, b = system.split(y)
        for key, val in (("t", t), ("M", M), ("Q", Q), ("a", a), ("b", b), ("error", error),
                         ("error_stderr", float(error_se)), ("drift_err", drift_err)):
            self.rows[key].append(np.asarray(val).tolist())

    def trajectory(self, params: dict, stats: dict) -> Trajectory:
        arrays: dict[str, Any] = {k: np.asarray(v, dtype=float) for k, v in self.rows.items()}
        stats = dict(stats)
        if self.watch.warnings:
            stats["warnings"] = list(self.watch.warnings)
        if self.accuracy:
            stats["drift_accuracy"] = list(self.accuracy)
        return Trajectory(**arrays, params=params, stats=stats)


def integrate_ode(task: Task, act: Activation, ic: InitialCondition, gamma: float, T: float,
                  times: Sequence[float] | np.ndarray | None = None, method: str = "rk4",
                  dt: float = 0.2,
                  engine: DriftEngine | None = None, train_a: bool | None = None,
                  train_b: bool | None = None, gamma_a: float | None = None,
                  gamma_b: float | None = None, gradient_flow: bool = False,
                  rescale_time: bool = False, rtol: float = 1e-6, atol: float = 1e-9,
                  out: str | Path | None = None, checkpoint_every: int = 20,
                  progress: bool = True) -> Trajectory:
    """Integrate the order-parameter ODEs from ``ic`` (at t = 0) up to T; the trajectory at
    ``times``.

    ``times``: output times in [0, T] (default 101 evenly spaced); the start is recorded only
    when 0 is among them.  ``method``: ``rk4`` (fixed steps ≤ dt) or ``rk45`` / ``dop853`` /
    ``solve_ivp`` (= ``rk45``; adaptive with rtol/atol, first step dt, dense output at
    ``times``).  ``engine``: a drift engine (default ``MonteCarloDrift(20000, seed=0)``; see
    ``expect.engines.build_engine``).  With ``out`` the result is written there atomically, and
    a checkpoint next to it lets an interrupted run resume with the same parameters.  Raises
    :class:`BlowUpError` when the state leaves the admissible set."""
    if method not in METHODS:
        fail("method", f"must be one of {', '.join(METHODS)}", method)
    check_state_for_task(ic.state, task)
    engine = MonteCarloDrift() if engine is None else engine
    if method != "rk4" and engine.fresh:
        fail("engine", "fresh samples give a noisy right-hand side; use method='rk4' with them",
             "fresh")
    dt = check_positive(dt, "dt")
    rtol, atol = check_positive(rtol, "rtol"), check_positive(atol, "atol")
    checkpoint_every = check_int(checkpoint_every, "checkpoint_every", 1)
    t_out = output_times(T, times)
    system, rates = build_system(task, act, ic.state.H, engine, gamma, train_a, train_b,
                                 gamma_a, gamma_b, gradient_flow, rescale_time)
    params = {"task": task.params(), "activation": act.params(), "initial": ic.params(),
              **rates, "T": float(T), "times": t_out, "method": method, "dt": dt,
              "rtol": rtol, "atol": atol, "engine": engine.params(),
              "time_unit": "gamma*t" if rescale_time else "t"}
    checkpoint = Checkpoint(out) if out is not None else None
    saved = checkpoint.load(params) if checkpoint else None
    s = ic.state
    run_cls = _FixedRun if method == "rk4" else _AdaptiveRun
    run = run_cls(system, t_out, system.join(s.M, s.Q, s.a, s.b), checkpoint, params,
                  checkpoint_every, progress)
    if saved is not None:
        run.restore(saved)
        assert checkpoint is not None            # (saved comes from it)
        note(f"ode: resumed from t = {run.current_time():.6g} ({len(run.rec.rows['t'])} of "
             f"{len(t_out)} records) from {checkpoint.path}")
    traj = run.go()
    probe = getattr(engine, "probe", None)       # set by auto (``engines.SelectedEngine``)
    if probe is not None:
        traj.stats["engine_probe"] = probe  # how auto chose (timings: not a parameter)
    if out is not None:
        traj.save(out)
        assert checkpoint is not None            # made whenever out is given
        checkpoint.clear()
    return traj


class _Run:
    """What both integrators share: the state, the records, checkpoints, the progress bar.

    ``off_grid_records``: whether recorded states lie off the step grid (dense output), so that
    recording E there costs evaluations of its own (counted in ``record_evaluations``).

    Subclasses implement ``advance`` (run to the end, recording on the way) and say which
    position they save (``position``/``set_position``)."""

    off_grid_records: bool                       # set by each subclass

    def __init__(self, system: OdeSystem, t_out: np.ndarray, y: np.ndarray,
                 checkpoint: Checkpoint | None, params: dict, every: int, progress: bool) -> None:
        self.system, self.t_out, self.y = system, t_out, y
        self.grid, self.record_start = integration_grid(t_out)
        self.rec = _Recorder()
        self.checkpoint, self.params = checkpoint, params
        self.every, self.progress = every, progress
        self.started = False
        self.stats = {"rhs_evaluations": 0, "record_evaluations": 0, "error_evaluations": 0,
                      "steps": 0}
        self.last_save = time.monotonic()

    def restore(self, saved: dict) -> None:
        self.y = np.asarray(saved["y"], dtype=float)
        self.rec = _Recorder(saved["rows"])
        self.stats = dict(saved["stats"])
        self.set_position(saved["position"])
        self.started = True
        if saved.get("rng") is not None and hasattr(self.system.engine, "set_rng_state"):
            self.system.engine.set_rng_state(saved["rng"])

    def save(self) -> None:
        self.last_save = time.monotonic()
        if self.checkpoint is None:
            return
        engine = self.system.engine
        # fresh engines sample (``SampleDrift.rng_state``, also through auto's wrapper)
        rng = engine.rng_state() if getattr(engine, "fresh", False) else None  # type: ignore[attr-defined]
        self.checkpoint.save(self.params, {"y": self.y.tolist(), "position": self.position(),
                                           "rows": self.rec.rows, "stats": self.counted(),
                                           "rng": rng})

    def maybe_save(self) -> None:
        """Every ``every`` steps, or when the last save is CHECKPOINT_SECONDS old."""
        if (self.stats["steps"] % self.every == 0
                or time.monotonic() - self.last_save > CHECKPOINT_SECONDS):
            self.save()

    def counted(self) -> dict:
        """The counts so far, including the RHS evaluations of this process."""
        return {**self.stats, "rhs_evaluations": self.stats["rhs_evaluations"]
                + self.system.evaluations - self._evaluations_at_start}

    def record(self, t: float, y: np.ndarray, dense: bool = False) -> None:
        before, before_e = self.system.evaluations, self.system.error_evaluations
        self.rec.record(self.system, t, y, dense)
        if self.off_grid_records:  # (RK4 records at step ends: the next step reuses them)
            self.stats["record_evaluations"] += self.system.evaluations - before
        self.stats["error_evaluations"] = (self.stats.get("error_evaluations", 0)
                                           + self.system.error_evaluations - before_e)

    def go(self) -> Trajectory:
        self._evaluations_at_start = self.system.evaluations
        if not self.started:
            if self.record_start:
                self.record(0.0, self.y)
            self.started = True
        end = float(self.grid[-1])
        # hidden without progress, but always there: its pilot guards the hour
        bar = progress_bar(end, "ode", unit="t", initial=self.current_time(), pilot=True,
                           show=self.progress)
        try:
            self.advance(bar)
        finally:
            if bar is not None:
                bar.close()
        return self.rec.trajectory(self.params, self.counted())

    # subclass interface
    def position(self) -> dict:
        raise NotImplementedError

    def set_position(self, pos: dict) -> None:
        raise NotImplementedError

    def current_time(self) -> float:
        raise NotImplementedError

    def advance(self, bar: tqdm | None) -> None:
        raise NotImplementedError


class _FixedRun(_Run):
    """RK4: interval i of the grid (from grid[i] to grid[i+1]) in n_i equal steps ≤ dt."""

    interval, step = 0, 0
    off_grid_records = False

    @property
    def watch(self) -> StepWatch:
        if not hasattr(self, "_watch"):
            self._watch = StepWatch(self.system)
        return self._watch

    def position(self) -> dict:
        return {"interval": self.interval, "step": self.step}

    def set_position(self, pos: dict) -> None:
        self.interval, self.step = int(pos["interval"]), int(pos["step"])

    def n_steps(self, t0: float, t1: float) -> int:
        dt = self.params["dt"]
        return max(1, math.ceil((t1 - t0) / dt - 1e-9)) if t1 > t0 else 0

    def current_time(self) -> float:
        if self.interval >= len(self.grid) - 1:
            return float(self.grid[-1])
        t0, t1 = self.grid[self.interval], self.grid[self.interval + 1]
        return float(t0 + (t1 - t0) * self.step / max(1, self.n_steps(t0, t1)))

    def advance(self, bar: tqdm | None) -> None:
        while self.interval < len(self.grid) - 1:
            self.advance_interval(bar)

    def advance_interval(self, bar: tqdm | None = None) -> None:
        t0, t1 = float(self.grid[self.interval]), float(self.grid[self.interval + 1])
        n = self.n_steps(t0, t1)
        h = (t1 - t0) / n if n else 0.0
        while self.step < n:
            self.y = self.watch.step(t0 + self.step * h, self.y, h)
            self.step += 1
            self.stats["steps"] += 1
            if bar is not None:
                bar.update(h)
            if self.step < n:
                self.maybe_save()
        self.interval += 1
        self.step = 0
        self.record(t1, self.y)
        self.save()


class _AdaptiveRun(_Run):
    """An embedded RK pair stepped over [0, T]; records read off each step's dense output."""

    t, h, next_out = 0.0, None, 0
    f: np.ndarray | None = None       # the drift at (t, y), as the last step left it
    off_grid_records = True

    def position(self) -> dict:
        return {"t": self.t, "h": self.h, "next": self.next_out,
                "f": None if self.f is None else self.f.tolist()}

    def set_position(self, pos: dict) -> None:
        self.t, self.h, self.next_out = float(pos["t"]), pos["h"], int(pos["next"])
        self.f = None if pos.get("f") is None else np.asarray(pos["f"], dtype=float)

    def current_time(self) -> float:
        return self.t

    def solver(self) -> RK45 | DOP853:
        """A fresh solver at (t, y): the next step size restored, or dt for the first step."""
        T = float(self.grid[-1])
        first = self.params["dt"] if self.h is None else float(self.h)
        return ADAPTIVE[self.params["method"]](
            self._resumed_rhs(), self.t, self.y, T, rtol=self.params["rtol"],
            atol=self.params["atol"], first_step=min(first, T - self.t))

    def _resumed_rhs(self):
        """``system.rhs``, except that the solver's opening call at the saved (t, y) returns
        the saved drift.  The uninterrupted run's next step starts from the drift its last
        stage computed (FSAL); re-evaluating it can give another number where the engine
        would not compute it the same way again: ``laplace``'s per-step rung is the last
        step's anchor in the uninterrupted run and a new ladder's in the resumed one (level
        0.75 or 1 when abs_err is near tol)."""
        saved, t0, y0 = self.f, self.t, self.y.copy()
        if saved is None:
            return self.system.rhs

        def rhs(t: float, y: np.ndarray) -> np.ndarray:
            nonlocal saved
            if saved is not None and t == t0 and np.array_equal(y, y0):
                out, saved = saved.copy(), None
                return out
            return self.system.rhs(t, y)
        return rhs

    def advance(self, bar: tqdm | None) -> None:
        if self.record_start and self.next_out == 0:
            self.next_out = 1  # the start was recorded by go()
        if self.t >= float(self.grid[-1]):
            self.record_due(self.t, None)
            return
        # an engine with a per-step convergence check (``laplace``) runs it once per step
        per_step = getattr(self.system.engine, "per_step_check", None)
        with per_step() if per_step is not None else contextlib.nullcontext():
            self.steps(self.solver(), bar)

    def steps(self, solver: RK45 | DOP853, bar: tqdm | None) -> None:
        """Step to the end, recording and checkpointing on the way."""
        begin_step = getattr(self.system.engine, "begin_step", None)
        while solver.status == "running":
            t_old = self.t
            self.system.step_err = 0.0     # ``drift_err`` of dense records: this step's drifts
            if begin_step is not None:
                begin_step()
            message = self.step_inside(solver)
            if solver.status == "failed":
                raise BlowUpError(f"gamma: the adaptive integration failed at t = {t_old:.6g}: "
                                  f"{message}")
            self.stats["steps"] += 1
            self.record_due(solver.t, solver)
            self.t, self.y, self.h = float(solver.t), solver.y.copy(), float(solver.h_abs)
            self.f = np.array(solver.f, dtype=float)
            if bar is not None:
                bar.update(self.t - t_old)
            if solver.status == "running":
                self.maybe_save()

    def step_inside(self, solver: RK45 | DOP853) -> str | None:
        """One step of ``solver`` whose stages all stay admissible.

        An explicit stage can overshoot a boundary that the flow only approaches: in gradient
        flow λ_min(Q) can decay towards 0 (Gaussian prior: two keys turn antiparallel while
        their orthogonal parts decay), the steps grow long, and a trial stage lands past the
        boundary, where the drift is undefined (the accepted states stay inside).  Such a
        step is retried at :data:`STAGE_RETRY_FACTOR` of its size, as SciPy does after a
        failed error test (the solver's t, y and f are untouched by a step that raised); a
        blow-up that persists below :data:`STAGE_RETRY_FLOOR`·max(1, |t|) is the ODE's own and
        is raised; ``stats["stage_retries"]`` counts the retries."""
        while True:
            try:
                return solver.step()
            except BlowUpError:
                self.stats["stage_retries"] = self.stats.get("stage_retries", 0) + 1
                solver.h_abs *= STAGE_RETRY_FACTOR
                if solver.h_abs < STAGE_RETRY_FLOOR * max(1.0, abs(solver.t)):
                    raise

    def record_due(self, t_new: float, solver: RK45 | DOP853 | None) -> None:
        """Record every requested time ≤ t_new (the step's end exactly, earlier ones from the
        step's interpolant)."""
        dense = None
        while self.next_out < len(self.t_out) and self.t_out[self.next_out] <= t_new:
            t_req = float(self.t_out[self.next_out])
            if solver is None or t_req == t_new:
                y = self.y if solver is None else solver.y
            else:
                dense = dense or solver.dense_output()
                y = dense(t_req)
            self.record(t_req, y, dense=solver is not None and t_req != t_new)
            self.next_out += 1


def initial_condition(act: Activation, task: Task, H: int | None = None,
                      M0: object = None, Q0: object = None, a0: object = None, b0: object = None,
                      D: int | None = None, eta: float = 1.0, seed: int = 0) -> InitialCondition:
    """Given (M0, Q0[, a0, b0]) or drawn at finite D (k_h(0) ~ N(0, η²/D I)); a0/b0 default to
    the activation's presets (and override the drawn ones when given)."""
    if (M0 is None) != (Q0 is None):
        raise ValidationError("M0/Q0: give both M0 and Q0, or neither (then D draws them)")
    if M0 is not None:
        M = as_finite_array(M0, "M0", ndim=2)
        if M.shape[1] != task.F:
            fail("M0", f"must have F = {task.F} columns (one per signal strength)", M.shape)
        if H is not None and M.shape[0] != H:
            fail("H", f"must match the rows of M0 ({M.shape[0]})", H)
        H = M.shape[0]
        if H < 1:
            fail("H", "must be an integer >= 1", H)
        Q = as_finite_array(Q0, "Q0", ndim=2)
        if Q.shape != (H, H):
            fail("Q0", f"must have shape (H, H) = ({H}, {H})", Q.shape)
        check_psd(Q, "Q0")
        a = act.a_default(H, task.L) if a0 is None else head_vector(a0, "a0", H)
        b = act.b_default(H, task.L) if b0 is None else head_vector(b0, "b0", H)
        return InitialCondition.from_arrays(M, Q, a, b)
    if D is None:
        raise ValidationError("D: give either M0 and Q0, or D (with eta, seed) to draw them")
    if H is None:
        raise ValidationError("H: the number of heads is required when drawing at finite D")
    ic = InitialCondition.draw(act, H, task.F, task.L, D, eta, seed)
    if a0 is None and b0 is None:
        return ic
    s = ic.state
    state = type(s)(s.M, s.Q, s.a if a0 is None else head_vector(a0, "a0", H),
                    s.b if b0 is None else head_vector(b0, "b0", H))
    return InitialCondition(state, ic.origin, ic.D, ic.eta, ic.seed)


def head_vector(value: object, param: str, H: int) -> np.ndarray:
    """A given a0 or b0: H finite numbers (named as given, not as the state's a or b)."""
    arr = as_finite_array(value, param, ndim=1)
    if arr.shape != (H,):
        fail(param, f"must have length H = {H}", arr)
    return arr


MAX_START_ERROR = 1e-2  # step-doubling difference allowed at t = 0, relative to max(1, |y|)


def check_step_resolved(system: OdeSystem, state: State, dt: float, gamma: float) -> None:
    """Refuse a fixed RK4 step that cannot resolve the start.

    Step doubling at t = 0: one step of dt against two of dt/2; their difference (≈ 15/16 of
    the single step's local error) over max(1, max|y|) may not exceed
    :data:`MAX_START_ERROR`.  γ = 1e3 with dt = 0.2 fails it (RK4 then held E at 1.22 where
    rk45 gives 0.94).  The size of the first change is no criterion: at γ = 10 a step of 1
    changes the small initial state 4.5-fold, nearly all of it the γ² term, which RK4 follows
    (E within 1e-4 of rk45).  Costs three extra steps.  ``system`` must not rescale time.
    """
    y = system.join(state.M, state.Q, state.a, state.b)
    h = dt
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            one, _ = rk4_stages(system, 0.0, y, h)
            half, _ = rk4_stages(system, 0.0, y, h / 2)
            two, _ = rk4_stages(system, h / 2, half, h / 2)
            scale = max(1.0, float(np.max(np.abs(y))), float(np.max(np.abs(two))))
            err = float(np.max(np.abs(one - two))) / scale
    except BlowUpError:     # a trial stage left the admissible set: the step is the culprit
        err = float("inf")
    if not err <= MAX_START_ERROR:
        if np.isfinite(err):    # the local error of RK4 scales like dt^5
            found = (f"one step and two half steps differ by {err:.3g} of the state's size "
                     f"(allowed {MAX_START_ERROR:g})")
            advice = f"--dt <= {h * (MAX_START_ERROR / err) ** 0.2:.3g}"
        else:
            found, advice = "the trial steps diverge", "a much smaller --dt"
        fail("dt", f"an RK4 step of {h:g} does not resolve the dynamics at t = 0: {found} "
             f"(gamma = {gamma:g}); use {advice}, --method rk45 (adaptive), or a smaller "
             "--gamma", h)


def drift_at_state(system: OdeSystem, y: np.ndarray) -> dict:
    """dy/dt at the packed state y, split into dM (H, F), dQ (H, H), da, db (H,), with E, the
    per-field error estimates (``errors``) and the largest of them all (``abs_err``)."""
    d = system.means(0.0, y)
    dM, dQ, da, db = system.split(system.rhs_of(d) + 0.0)  # + 0.0: no -0 from a zero rate
    errors: dict = dict(system.rhs_errors(d))
    errors["error"] = float(d.stderr.get("error", 0.0))
    worst = max(float(np.max(v)) for v in errors.values())
    return {"dM": dM, "dQ": dQ, "da": da, "db": db, "error": d.error, "errors": errors,
            "abs_err": worst if np.isfinite(worst) else None}
