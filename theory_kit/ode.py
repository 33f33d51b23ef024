"""Integration of the order-parameter ODEs of online SGD (THEORY §5).

With the drift expectations of ``expect.drift`` (E[·] over θ and the scores):

    dM/dt = γ E[dM],      dQ/dt = γ E[dQ_lin] + γ² E[dQ_noise],
    da/dt = γ_a E[da] (a trained),   db/dt = γ_b E[db] (b trained),

with γ_a = γ_b = γ by default and the trained flags taken from the activation.  In the
gradient-flow mode the γ² noise term is dropped; with ``rescale_time`` the clock is
τ = γ t (so the rates are divided by γ and γ → 0 is a well-defined limit).

Integrators: fixed-step RK4 (steps of at most ``dt`` that land exactly on the requested
times; checkpoint every ``checkpoint_every`` steps) or ``scipy.integrate.solve_ivp`` (adaptive,
one call per interval between requested times; checkpoint after each).  A fixed-sample Monte
Carlo engine gives a smooth right-hand side, so adaptive stepping is sound; fresh samples are
only accepted with RK4.  The population error is recorded at every requested time from the
same engine.  A state that is non-finite or whose Q is not positive semi-definite raises
:class:`BlowUpError`, naming the time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.integrate import solve_ivp

from .activations import Activation
from .expect.drift import DriftMeans, MonteCarloDrift, SampleDrift
from .initial import InitialCondition
from .model import (State, Task, ValidationError, as_finite_array, check_psd,
                    check_state_for_task, fail)
from .progress import progress_bar
from .results import Checkpoint, read_json, write_json

METHODS = ("rk4", "solve_ivp")
PSD_BLOWUP_TOL = 1e-7
DIVERGENCE_BOUND = 1e8  # |Q_hh'| beyond this is a divergence, long before overflow


class BlowUpError(ValidationError):
    """The integration left the admissible set (non-finite values or Q not PSD) at some time."""


@dataclass
class Trajectory:
    """Order parameters at the requested times: t (n,), M (n,H,F), Q (n,H,H), a, b (n,H),
    the population error (n,) and its standard error, and every input in ``params``."""

    t: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray
    b: np.ndarray
    error: np.ndarray
    error_stderr: np.ndarray
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"t": self.t, "M": self.M, "Q": self.Q, "a": self.a, "b": self.b,
                "error": self.error, "error_stderr": self.error_stderr, "params": self.params}

    def state(self, i: int) -> State:
        """The order parameters at the i-th recorded time."""
        return State(self.M[i], self.Q[i], self.a[i], self.b[i])

    def save(self, path: str | Path) -> Path:
        """Write as JSON, atomically, with the toolkit version."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Trajectory":
        data = read_json(path)
        arrays = {k: np.asarray(data[k], dtype=float) for k in
                  ("t", "M", "Q", "a", "b", "error", "error_stderr")}
        return cls(**arrays, params=data.get("params", {}))


# ----------------------------------------------------------------------------- the system
@dataclass
class OdeSystem:
    """The right-hand side on the flat vector y = (M, Q, a, b) raveled."""

    task: Task
    act: Activation
    engine: SampleDrift
    H: int
    rate: float           # multiplies E[dM], E[dQ_lin]
    noise_rate: float     # multiplies E[dQ_noise] (0 in gradient flow)
    rate_a: float         # 0 when a is fixed
    rate_b: float         # 0 when b is fixed
    evaluations: int = 0
    _last: tuple | None = None

    def split(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        H, F = self.H, self.task.F
        i, j = H * F, H * F + H * H
        return (y[:i].reshape(H, F), y[i:j].reshape(H, H), y[j:j + H], y[j + H:j + 2 * H])

    @staticmethod
    def join(M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([M.ravel(), Q.ravel(), a.ravel(), b.ravel()])

    def means(self, t: float, y: np.ndarray) -> DriftMeans:
        """Drift expectations at y, after checking y is admissible.

        With fixed samples the last result is reused when y repeats (the error recorded at an
        output time and the first stage of the next step share their state)."""
        if self._last is not None and np.array_equal(self._last[0], y):
            return self._last[1]
        M, Q, a, b = self.split(y)
        check_admissible(t, M, Q, a, b)
        self.evaluations += 1
        result = self.engine.evaluate(self.task, self.act, M, 0.5 * (Q + Q.T), a, b)
        if not self.engine.fresh:
            self._last = (y.copy(), result)
        return result

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        d = self.means(t, y)
        dQ = self.rate * d.dQ_lin + self.noise_rate * d.dQ_noise
        return self.join(self.rate * d.dM, 0.5 * (dQ + dQ.T), self.rate_a * d.da,
                         self.rate_b * d.db)


def check_admissible(t: float, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                     b: np.ndarray) -> None:
    """Raise :class:`BlowUpError` at time t on non-finite values, a non-PSD Q, or
    max |Q_hh'| > DIVERGENCE_BOUND."""
    for name, arr in (("M", M), ("Q", Q), ("a", a), ("b", b)):
        if not np.all(np.isfinite(arr)):
            raise BlowUpError(f"gamma: the integration blew up at t = {t:.6g}: {name} is not "
                              "finite; reduce gamma (or dt)")
    scale = max(1.0, float(np.max(np.abs(Q))))
    if scale > DIVERGENCE_BOUND:
        raise BlowUpError(f"gamma: the integration blew up at t = {t:.6g}: |Q| reached "
                          f"{scale:.3g} > {DIVERGENCE_BOUND:.0e} (diverging); reduce gamma")
    low = float(np.linalg.eigvalsh(0.5 * (Q + Q.T)).min())
    if low < -PSD_BLOWUP_TOL * scale:
        raise BlowUpError(f"gamma: the integration blew up at t = {t:.6g}: Q lost positive "
                          f"semi-definiteness (smallest eigenvalue {low:.3g}); reduce gamma "
                          "(or dt)")


def rk4_step(system: OdeSystem, t: float, y: np.ndarray, h: float) -> np.ndarray:
    """One classical Runge–Kutta step of size h."""
    k1 = system.rhs(t, y)
    k2 = system.rhs(t + h / 2, y + h / 2 * k1)
    k3 = system.rhs(t + h / 2, y + h / 2 * k2)
    k4 = system.rhs(t + h, y + h * k3)
    return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


# ----------------------------------------------------------------------------- validation
def output_times(T: float, times: Sequence[float] | None, n_times: int = 101) -> np.ndarray:
    """Requested times: given (sorted, within [0, T]) or n_times evenly spaced on [0, T]."""
    T = float(as_finite_array(T, "T"))
    if T <= 0:
        fail("T", "total time must be > 0", T)
    if times is None:
        return np.linspace(0.0, T, n_times)
    arr = np.atleast_1d(as_finite_array(times, "times"))
    if arr.ndim != 1 or arr.size == 0 or np.any(np.diff(arr) < 0) or arr[0] < 0 or arr[-1] > T:
        fail("times", f"must be non-decreasing values in [0, T = {T:g}]", arr)
    return arr


def _positive(value: float, param: str) -> float:
    v = float(as_finite_array(value, param))
    if v <= 0:
        fail(param, "must be > 0", v)
    return v


def build_system(task: Task, act: Activation, H: int, engine: SampleDrift, gamma: float,
                 train_a: bool | None, train_b: bool | None, gamma_a: float | None,
                 gamma_b: float | None, gradient_flow: bool, rescale_time: bool
                 ) -> tuple[OdeSystem, dict]:
    """The ODE system and the resolved rate parameters (for ``params``)."""
    gamma = _positive(gamma, "gamma")
    gamma_a = gamma if gamma_a is None else _positive(gamma_a, "gamma_a")
    gamma_b = gamma if gamma_b is None else _positive(gamma_b, "gamma_b")
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
        self.rows = rows or {k: [] for k in ("t", "M", "Q", "a", "b", "error", "error_stderr")}

    def record(self, system: OdeSystem, t: float, y: np.ndarray) -> None:
        d = system.means(t, y)
        M, Q, a, b = system.split(y)
        for key, val in (("t", t), ("M", M), ("Q", Q), ("a", a), ("b", b), ("error", d.error),
                         ("error_stderr", float(d.stderr.get("error", 0.0)))):
            self.rows[key].append(np.asarray(val).tolist())

    def trajectory(self, params: dict) -> Trajectory:
        return Trajectory(**{k: np.asarray(v, dtype=float) for k, v in self.rows.items()},
                          params=params)


def integrate_ode(task: Task, act: Activation, ic: InitialCondition, gamma: float, T: float,
                  times: Sequence[float] | None = None, method: str = "rk4", dt: float = 0.2,
                  engine: SampleDrift | None = None, train_a: bool | None = None,
                  train_b: bool | None = None, gamma_a: float | None = None,
                  gamma_b: float | None = None, gradient_flow: bool = False,
                  rescale_time: bool = False, rtol: float = 1e-6, atol: float = 1e-9,
                  out: str | Path | None = None, checkpoint_every: int = 20,
                  progress: bool = True) -> Trajectory:
    """Integrate the order-parameter ODEs from ``ic`` up to T and return the trajectory.

    ``times``: output times in [0, T] (default 101 evenly spaced).  ``method``: ``rk4``
    (fixed steps ≤ dt) or ``solve_ivp`` (RK45 with rtol/atol).  ``engine``: a drift engine
    (default ``MonteCarloDrift(20000, seed=0)``).  With ``out`` the result is written there
    atomically, and a checkpoint next to it lets an interrupted run resume with the same
    parameters.  Raises :class:`BlowUpError` when the state leaves the admissible set."""
    if method not in METHODS:
        fail("method", f"must be one of {', '.join(METHODS)}", method)
    check_state_for_task(ic.state, task)
    engine = MonteCarloDrift() if engine is None else engine
    if method == "solve_ivp" and engine.fresh:
        fail("engine", "fresh samples give a noisy right-hand side; use method='rk4' with them",
             "fresh")
    dt = _positive(dt, "dt")
    checkpoint_every = int(checkpoint_every)
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
    y = system.join(s.M, s.Q, s.a, s.b)
    run = _Run(system, t_out, y, _Recorder(), method, dt, rtol, atol, checkpoint, params,
               checkpoint_every, progress)
    if saved is not None:
        run.restore(saved)
    traj = run.go()
    if out is not None:
        traj.save(out)
        checkpoint.clear()
    return traj


class _Run:
    """The stepping loop with checkpoints: interval i (from t_out[i] to t_out[i+1]), step j."""

    def __init__(self, system: OdeSystem, t_out: np.ndarray, y: np.ndarray, rec: _Recorder,
                 method: str, dt: float, rtol: float, atol: float,
                 checkpoint: Checkpoint | None, params: dict, every: int, progress: bool) -> None:
        self.system, self.t_out, self.y, self.rec = system, t_out, y, rec
        self.method, self.dt, self.rtol, self.atol = method, dt, rtol, atol
        self.checkpoint, self.params = checkpoint, params
        self.every, self.progress = every, progress
        self.interval, self.step = 0, 0
        self.started = False

    def restore(self, saved: dict) -> None:
        self.y = np.asarray(saved["y"], dtype=float)
        self.interval, self.step = int(saved["interval"]), int(saved["step"])
        self.rec = _Recorder(saved["rows"])
        self.started = True
        if saved.get("rng") is not None and hasattr(self.system.engine, "set_rng_state"):
            self.system.engine.set_rng_state(saved["rng"])

    def save(self) -> None:
        if self.checkpoint is None:
            return
        engine = self.system.engine
        rng = engine.rng_state() if getattr(engine, "fresh", False) else None
        self.checkpoint.save(self.params, {"y": self.y.tolist(), "interval": self.interval,
                                           "step": self.step, "rows": self.rec.rows, "rng": rng})

    def current_time(self) -> float:
        if self.interval >= len(self.t_out) - 1:
            return float(self.t_out[-1])
        t0, t1 = self.t_out[self.interval], self.t_out[self.interval + 1]
        return float(t0 + (t1 - t0) * self.step / self.n_steps(t0, t1))

    def n_steps(self, t0: float, t1: float) -> int:
        return max(1, math.ceil((t1 - t0) / self.dt - 1e-9)) if t1 > t0 else 0

    def go(self) -> Trajectory:
        if not self.started:
            self.rec.record(self.system, float(self.t_out[0]), self.y)
            self.started = True
        bar = progress_bar(float(self.t_out[-1]), "ode", unit="t",
                           initial=self.current_time()) if self.progress else None
        try:
            while self.interval < len(self.t_out) - 1:
                self.advance_interval(bar)
        finally:
            if bar is not None:
                bar.close()
        return self.rec.trajectory(self.params)

    def advance_interval(self, bar: object = None) -> None:
        t0, t1 = float(self.t_out[self.interval]), float(self.t_out[self.interval + 1])
        if self.method == "rk4":
            n = self.n_steps(t0, t1)
            h = (t1 - t0) / n if n else 0.0
            while self.step < n:
                self.y = rk4_step(self.system, t0 + self.step * h, self.y, h)
                self.step += 1
                if bar is not None:
                    bar.update(h)
                if self.step % self.every == 0 and self.step < n:
                    self.save()
        elif t1 > t0:
            sol = solve_ivp(self.system.rhs, (t0, t1), self.y, method="RK45", rtol=self.rtol,
                            atol=self.atol, first_step=min(self.dt, t1 - t0))
            if not sol.success:
                raise BlowUpError(f"gamma: solve_ivp failed between t = {t0:.6g} and "
                                  f"{t1:.6g}: {sol.message}")
            self.y = sol.y[:, -1]
            if bar is not None:
                bar.update(t1 - t0)
        self.interval += 1
        self.step = 0
        self.rec.record(self.system, t1, self.y)
        self.save()


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
        a = act.a_default(H, task.L) if a0 is None else a0
        b = act.b_default(H, task.L) if b0 is None else b0
        return InitialCondition.from_arrays(M, Q, a, b)
    if D is None:
        raise ValidationError("D: give either M0 and Q0, or D (with eta, seed) to draw them")
    if H is None:
        raise ValidationError("H: the number of heads is required when drawing at finite D")
    ic = InitialCondition.draw(act, H, task.F, task.L, D, eta, seed)
    if a0 is None and b0 is None:
        return ic
    s = ic.state
    state = type(s)(s.M, s.Q, s.a if a0 is None else np.asarray(a0, float),
                    s.b if b0 is None else np.asarray(b0, float))
    return InitialCondition(state, ic.origin, ic.D, ic.eta, ic.seed)
