"""Finite-D online SGD (docs/theory.md §1, §5, §7): brute force and an exact reduced simulation.

One fresh sample per step: tokens x_l = z_l + 1[l = ε] U θ, values c_l ~ N(0, 1),
y = c_ε + √Δ ξ, prediction ŷ = Σ_l w_l(S) c_l with scores s_{hl} = k_h · x_l, and

    k_h ← k_h + (γ/D) r (Σ_l G_{hl} x_l + 2 R_h k_h),    r = y − ŷ,

with G_{hl} = ∂ŷ/∂s_{hl} = J_{hl}·c and R_h = ∂ŷ/∂Q_{hh} (Bayes offsets only); trained scalars
move as a_h ← a_h + (γ_a/D) r ∂ŷ/∂a_h and b_h ← b_h + (γ_b/D) r ∂ŷ/∂b_h.  Time t = steps/D.
Writing β_{hl} = (γ/D) r G_{hl} and ρ_h = (γ/D) r 2R_h, one step is

    k_h ← (1 + ρ_h) k_h + Σ_l β_{hl} x_l.

Methods (both vectorised over runs, same law at every D):

* ``brute``: explicit keys (runs × H × D); U = the first F coordinate axes, which is exact in
  law because the data law is invariant under rotations fixing span(U).
* ``reduced``: the state is the Gram matrix of {u_1..u_F, k_1..k_H}, stored as M = (k_h·u_f) and
  the Gram matrix O = Q − M Mᵀ of the keys' components orthogonal to span(U) (and, for the
  steps, the key coordinates K = [M | P] below).  With O = P Pᵀ
  (Cholesky, or a clipped eigendecomposition when O is singular) the keys have coordinates
  [M | P] on an orthonormal system e_1..e_{F+H} containing span{u, k} (extra directions are
  allowed: they only carry zero key components).  A fresh token has i.i.d. N(0, 1) coordinates
  (p_l, q_l) on that system (plus θ on p at the signal token), and its remainder lies in the
  D − F − H dimensional complement, so the Gram matrix of the remainders of the L tokens is
  G ~ Wishart_L(D − F − H, I).  The step is then exact:

      M ← (1+ρ) M + β p,   P ← (1+ρ) P + β q,   O ← P Pᵀ + β G βᵀ,

  which includes the γ² term |Σ_l β_{hl} x_l|².  β G βᵀ ~ Wishart_H(D − F − H, β βᵀ) exactly,
  drawn as Y Yᵀ with Y = C B, C Cᵀ = β βᵀ and B a factor of Wishart_H(D − F − H, I) when
  H < L, or Y = β B with B a factor of G when L ≤ H (:mod:`theory_kit.dynamics.sgd_step`): a factor
  of size p = min(H, L).  The cost per step does not depend on D.
  The steps run compiled (:mod:`theory_kit.dynamics.sgd_step`) over blocks of steps and all runs,
  on random numbers drawn for the block in NumPy beforehand; the loop assembles each step's
  tokens [p | q | A] from them itself.  Stream layout of a block of m steps for R runs, one
  call each, in this order: ε (m, R) integers, θ (m·R draws of the prior), c (m, R, L), ξ
  (m, R), [p | q] (m, R, L, F + H) standard normals, then the Wishart_p factor's
  N(0, 1) (m, R, p(p−1)/2) and χ²(D − F − H − i) (m, R, p) (or N(0, 1) (m, R, p, D − F − H)
  when D − F − H < p).  This is stream layout STREAM_LAYOUT = 3 (recorded in the parameters):
  layouts 1–2 drew the L × L factor of G, so their numbers differ (same law).  Blocks start at
  fixed step indices (see :func:`simulate`), so a seed fixes every number and a resumed run
  continues the same stream.

The step coefficients of both methods come from the generated per-sample kernels of the
activation (:func:`kernels.sample_kernels`), the same code for presets and a user's φ.

Recorded at each requested time: M, Q, a, b, the population error E = Δ + E|δ_ε − w|²
estimated by Monte Carlo from the exact law of the scores given (M, Q, a, b) (``error``, with
``error_samples`` fresh draws from a separate seeded stream, so recording never changes the
trajectory), and the running training error: the average of Δ + |δ_ε − w|² over the SGD samples
seen since the previous recorded time (``error_running``, NaN at a time with no steps before it).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike

from ..expect.error import squared_residual
from ..io.progress import note, progress_bar
from ..io.results import (
    Checkpoint,
    is_current,
    read_json,
    set_aside,
    to_jsonable,
    write_json,
)
from ..model.activations import Activation
from ..model.initial import InitialCondition
from ..model.state import check_state_for_task
from ..model.task import Task
from ..model.validation import ValidationError, as_finite_array, check_int, check_number, fail
from .sgd_states import (
    BruteState,
    CorruptCheckpoint,
    ReducedState,
    Scalars,
    _checked_array,
    draw_samples,
    step_kernels,
)
from .sgd_step import (
    FAULT_NONE,
    FAULT_NONFINITE,
    FAULT_NORMALISER,
    psd_factor,
)
from .simulation import Simulation

METHODS = ("reduced", "brute")
# a checkpoint at least this often (checked between blocks), so a kill every 20 s loses nothing
CHECKPOINT_SECONDS = 10.0
# layout of the saved progress; bump when it changes (an older checkpoint is then set aside)
CHECKPOINT_SCHEMA = 3
# layout of the random stream of the reduced method (module docstring); part of the parameters,
# so a result file or checkpoint of another layout is not taken for this run's
STREAM_LAYOUT = 3


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class SimConfig:
    """Everything that fixes the law (and, with the seed, the numbers) of a simulation."""

    task: Task
    act: Activation
    H: int
    D: int
    times: tuple[float, ...]
    runs: int = 1
    gamma: float = 1.0
    eta: float = 1.0
    seed: int = 0
    method: str = "reduced"
    initial: InitialCondition | None = None
    train_a: bool | None = None
    train_b: bool | None = None
    gamma_a: float | None = None
    gamma_b: float | None = None
    error_samples: int = 512
    wishart_dof: int | None = field(default=None)  # test-only: override D − F − H

    def __post_init__(self) -> None:
        check_int(self.H, "H", 1)
        check_int(self.runs, "runs", 1)
        check_int(self.seed, "seed", 0)
        check_int(self.error_samples, "error_samples", 1)
        if self.method not in METHODS:
            fail("method", f"must be one of {', '.join(METHODS)}", self.method)
        check_int(self.D, "D", self.min_dimension())
        for name in ("gamma", "eta", "gamma_a", "gamma_b"):
            val = getattr(self, name)
            if val is not None:
                check_number(val, name, minimum=0.0)
        times = as_finite_array(self.times, "times", ndim=1)
        if times.size == 0 or np.any(times < 0) or np.any(np.diff(times) <= 0):
            fail("times", "must be a non-empty increasing list of times >= 0", times)
        object.__setattr__(self, "times", tuple(float(t) for t in times))
        if self.initial is not None:
            check_state_for_task(self.initial.state, self.task)
            if self.initial.state.H != self.H:
                fail("H", f"must match the initial condition's {self.initial.state.H} heads",
                     self.H)
        if self.wishart_dof is not None and self.wishart_dof < 0:
            fail("wishart_dof", "must be >= 0", self.wishart_dof)

    def min_dimension(self) -> int:
        """Smallest D: the reduced method needs room for u, the keys and a token remainder
        (D ≥ F + H + 1); brute force only needs U (D ≥ F), or D ≥ F + H to place given
        initial overlaps."""
        F, H = self.task.F, self.H
        if self.method == "reduced":
            return F + H + 1
        return max(1, F + (H if self.initial is not None else 0))

    @property
    def trained(self) -> tuple[bool, bool]:
        """(train_a, train_b), defaulting to the activation's conventions."""
        return (self.act.train_a if self.train_a is None else bool(self.train_a),
                self.act.train_b if self.train_b is None else bool(self.train_b))

    def rates(self) -> np.ndarray:
        """(γ, γ_a, γ_b)/D, zero for an untrained scalar."""
        ta, tb = self.trained
        ga = self.gamma if self.gamma_a is None else self.gamma_a
        gb = self.gamma if self.gamma_b is None else self.gamma_b
        return np.array([self.gamma, ga * ta, gb * tb]) / self.D

    def record_steps(self) -> np.ndarray:
        """Step index of each recorded time (t = steps/D, rounded)."""
        return np.round(np.asarray(self.times) * self.D).astype(np.int64)

    def params(self) -> dict:
        ta, tb = self.trained
        return {"method": self.method, "stream": STREAM_LAYOUT, "D": self.D, "H": self.H,
                "runs": self.runs,
                "seed": self.seed, "gamma": self.gamma, "eta": self.eta,
                "gamma_a": self.gamma if self.gamma_a is None else self.gamma_a,
                "gamma_b": self.gamma if self.gamma_b is None else self.gamma_b,
                "train_a": ta, "train_b": tb, "times": list(self.times),
                "error_samples": self.error_samples, "wishart_dof": self.wishart_dof,
                "task": self.task.params(), "activation": self.act.params(),
                "initial": None if self.initial is None else self.initial.params()}


# ----------------------------------------------------------------------------- running
def estimate_error(cfg: SimConfig, kernels: Any, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                   b: np.ndarray, record_index: int) -> np.ndarray:
    """Population error Δ + E|δ_0 − w|² per run, from n exact draws of the scores given (M, Q):
    s_{:,l} = 1[l = 0] M θ + Q^{1/2} g_l.  Uses its own stream seeded by (seed, record index).

    M (R, H, F), Q (R, H, H), a, b (R, H); returns (R,).  Weights from the generated kernels."""
    rng = np.random.default_rng([cfg.seed, 1, record_index])
    n, (R, H, F), L = cfg.error_samples, M.shape, cfg.task.L
    theta = cfg.task.prior.sample(rng, n * R).reshape(n, R, F)
    S = psd_factor(Q) @ rng.standard_normal((n, R, H, L))
    S[..., 0] += np.einsum("rhf,nrf->nrh", M, theta)
    per_sample = lambda x: np.broadcast_to(x, (n, R, H)).reshape(n * R, H)  # noqa: E731
    _, _, _, w = kernels.weights(S.reshape(n * R, H, L), per_sample(b),
                                 per_sample(np.einsum("rhh->rh", Q)), per_sample(a))
    return cfg.task.delta + squared_residual(w).reshape(n, R).mean(axis=0)


def _initial_state(cfg: SimConfig, rng: np.random.Generator) -> ReducedState | BruteState:
    F = cfg.task.F
    if cfg.method == "reduced":
        if cfg.initial is not None:
            return ReducedState.given(cfg.initial, cfg.runs, cfg.D, cfg.wishart_dof)
        return ReducedState.drawn(rng, cfg.runs, cfg.H, F, cfg.D, cfg.eta, cfg.wishart_dof)
    if cfg.initial is not None:
        return BruteState.given(cfg.initial, cfg.runs, cfg.D)
    return BruteState.drawn(rng, cfg.runs, cfg.H, F, cfg.D, cfg.eta)


class _Run:
    """Mutable progress of a simulation: state, scalars, RNG, records; (de)serialisable."""

    def __init__(self, cfg: SimConfig, kernels: Any):
        self.cfg, self.kernels = cfg, kernels
        self.rng = np.random.default_rng(cfg.seed)
        self.state = _initial_state(cfg, self.rng)
        self.scalars = Scalars.initial(cfg)
        self.step_count = 0
        self.sq_count = 0
        self.records: list[dict[str, np.ndarray]] = []

    def snapshot(self) -> dict:
        sc = self.scalars
        return {"schema": CHECKPOINT_SCHEMA, "step": self.step_count,
                "rng": self.rng.bit_generator.state, "state": self.state.to_dict(), "a": sc.a,
                "b": sc.b, "sq_sum": sc.sq_sum, "sq_count": self.sq_count,
                "records": self.records}

    def restore(self, saved: dict) -> None:
        """Load a snapshot, checking it against this configuration (CorruptCheckpoint if not)."""
        if not isinstance(saved, dict) or saved.get("schema") != CHECKPOINT_SCHEMA:
            raise CorruptCheckpoint(f"not a simulate checkpoint of schema {CHECKPOINT_SCHEMA}")
        targets = self.cfg.record_steps()
        R, H = self.cfg.runs, self.cfg.H
        step, records, count = int(saved["step"]), saved["records"], int(saved["sq_count"])
        n_rec = len(records) if isinstance(records, list) else -1
        lo = int(targets[n_rec - 1]) if n_rec > 0 else 0
        if not (0 <= n_rec <= len(targets)
                and lo <= step <= int(targets[min(n_rec, len(targets) - 1)])
                and 0 <= count <= step):
            raise CorruptCheckpoint(f"step {step} with {n_rec} records does not fit the times")
        self.state.load(saved["state"])
        self.scalars.a = _checked_array(saved, "a", (R, H))
        self.scalars.b = _checked_array(saved, "b", (R, H))
        self.scalars.sq_sum = _checked_array(saved, "sq_sum", (R,))
        self.rng.bit_generator.state = saved["rng"]
        self.step_count, self.sq_count = step, count
        self.records = [self._checked_record(rec) for rec in records]

    def _checked_record(self, rec: dict) -> dict[str, np.ndarray]:
        """A saved record as arrays of this run's shapes (CorruptCheckpoint if not)."""
        R, H, F = self.cfg.runs, self.cfg.H, self.cfg.task.F
        shapes = {"M": (R, H, F), "Q": (R, H, H), "a": (R, H), "b": (R, H), "error": (R,)}
        out = {k: _checked_array(rec, k, shape) for k, shape in shapes.items()}
        # NaN (null in the file) where no step preceded the record
        running = np.array([np.nan if v is None else v for v in rec["error_running"]], float)
        if running.shape != (R,):
            raise CorruptCheckpoint(f"'error_running' has shape {running.shape}, expected {(R,)}")
        return {**out, "error_running": running}

    def record(self) -> None:
        M, Q = self.state.order_parameters()
        if not (np.all(np.isfinite(M)) and np.all(np.isfinite(Q))):
            raise ValidationError(f"gamma: the simulation diverged before t = "
                                  f"{self.step_count / self.cfg.D:g} (non-finite overlaps); "
                                  "use a smaller step size")
        idx, sc = len(self.records), self.scalars
        running = sc.sq_sum / self.sq_count if self.sq_count else np.full(self.cfg.runs, np.nan)
        error = estimate_error(self.cfg, self.kernels, M, Q, sc.a, sc.b, idx)
        # arrays, not lists: a checkpoint then serialises each in one call
        self.records.append({"M": M, "Q": Q, "a": sc.a.copy(), "b": sc.b.copy(), "error": error,
                             "error_running": running})
        sc.sq_sum, self.sq_count = np.zeros(self.cfg.runs), 0

    def advance(self, n_steps: int, after_block: Callable[[int], None] | None = None) -> None:
        """n_steps SGD steps, drawing randomness block by block (blocks start at this call);
        ``after_block(m)`` runs after each block of m steps (progress, checkpoints)."""
        cfg, state = self.cfg, self.state
        block = state.block_steps(cfg.runs, cfg.task.L)
        done = 0
        while done < n_steps:
            m = min(block, n_steps - done)
            smp = draw_samples(cfg.task, self.rng, m, cfg.runs)
            tokens = state.draw_tokens(self.rng, m, smp)
            # each state class draws the tokens its own steps take (reduced: TokenDraws)
            bad, kind = state.steps(self.kernels, smp, tokens, self.scalars)  # type: ignore[arg-type]
            if kind != FAULT_NONE:
                self._fail(self.step_count + bad, kind)
            done += m
            self.step_count += m
            self.sq_count += m
            if after_block is not None:
                after_block(m)

    def _fail(self, step: int, kind: int) -> None:
        t = f"t = {(step + 1) / self.cfg.D:g}"
        if kind == FAULT_NORMALISER:
            raise ValidationError(f"activation '{self.cfg.act.name}': the normaliser N = kappa + "
                                  f"sum phi must be > 0, but it was <= 0 at {t} (phi must be "
                                  "non-negative and not all zero)")
        assert kind == FAULT_NONFINITE
        raise ValidationError(f"gamma: the simulation diverged at {t} (non-finite keys, a or b);"
                              " use a smaller step size")

    def result(self) -> Simulation:
        rec = {k: np.array([r[k] for r in self.records], dtype=float) for k in self.records[0]}
        # records are (times, runs, ...): put runs first
        arrs = {k: np.swapaxes(v, 0, 1) for k, v in rec.items()}
        return Simulation(np.array(self.cfg.times), arrs["M"], arrs["Q"], arrs["a"], arrs["b"],
                         arrs["error"], arrs["error_running"], self.cfg.params())


def _chunks(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """Pieces of [start, stop) with boundaries at multiples of ``size``: each starts a new
    block of random numbers, so the stream layout is fixed by the step indices alone."""
    edges = [start] + [k for k in range(size * (start // size + 1), stop, size)] + [stop]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def _set_aside(checkpoint: Checkpoint, reason: str) -> None:
    """Rename an unusable checkpoint out of the way (kept for inspection), with one warning."""
    set_aside(checkpoint.path, f"not a usable simulate checkpoint ({reason})")


def _resumed_run(cfg: SimConfig, kernels: Any, checkpoint: Checkpoint | None) -> _Run:
    """A fresh run, or the checkpoint's progress when it was made by this configuration.

    A foreign (other parameters) or corrupt checkpoint is set aside and the run starts clean."""
    run = _Run(cfg, kernels)
    if checkpoint is None or not checkpoint.path.is_file():
        return run
    try:
        saved = checkpoint.load(cfg.params())
        if saved is None:  # foreign or corrupt: results.Checkpoint has set it aside already
            return run
        run.restore(saved)
    except (CorruptCheckpoint, ValueError, KeyError, TypeError, IndexError, AttributeError,
            RecursionError, UnicodeDecodeError) as exc:
        _set_aside(checkpoint, str(exc) or type(exc).__name__)
        return _Run(cfg, kernels)
    note(f"simulate: resumed from t = {run.step_count / cfg.D:.6g} ({len(run.records)} of "
         f"{len(cfg.times)} records) from {checkpoint.path}")
    return run


def simulate(cfg: SimConfig, checkpoint: Checkpoint | None = None) -> Simulation:
    """Run ``cfg.runs`` independent SGD runs (vectorised) and record the requested times.

    With a :class:`results.Checkpoint`, progress (state of all runs, RNG state, step count,
    records) is saved between blocks of steps at least every ``CHECKPOINT_SECONDS``, and a
    rerun with the same parameters resumes from it; the numbers are bit-identical to an
    uninterrupted run because the blocks of random numbers always start at the same step
    indices (multiples of D, recorded steps, and every ``block_steps`` after those)."""
    kernels = step_kernels(cfg.act)
    run = _resumed_run(cfg, kernels, checkpoint)
    params = cfg.params()
    targets = cfg.record_steps()
    chunk = max(1, cfg.D)
    last_save = time.monotonic()

    with progress_bar(total=int(targets[-1]), desc=f"simulate ({cfg.method})", unit="step",
                      initial=run.step_count, pilot=True) as bar:

        def after_block(m: int) -> None:
            # saving rewrites every record so far, so it is rate-limited (its cost would grow
            # like records² if saved at each record)
            nonlocal last_save
            bar.update(m)
            if checkpoint is not None and time.monotonic() - last_save > CHECKPOINT_SECONDS:
                checkpoint.save(params, run.snapshot())
                last_save = time.monotonic()

        for idx in range(len(run.records), len(targets)):
            for lo, hi in _chunks(run.step_count, int(targets[idx]), chunk):
                run.advance(hi - lo, after_block)
            run.record()
            after_block(0)
    return run.result()


def stored_result(cfg: SimConfig, out: str | os.PathLike) -> Simulation | None:
    """The result already in ``out`` when it was written by this configuration and this
    toolkit code (``results.is_current``; so rerunning a finished command does not
    recompute), else None."""
    path = Path(out)
    if not path.is_file():
        return None
    try:
        data = read_json(path)
        if not is_current(data) or data.get("params") != to_jsonable(cfg.params()):
            return None
        return Simulation.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, UnicodeDecodeError,
            OSError):
        return None  # not ours or unreadable: recompute and overwrite


def simulate_to_file(cfg: SimConfig, out: str | os.PathLike) -> Simulation:
    """:func:`simulate` with a resumable checkpoint next to ``out``; writes ``out`` atomically.
    Returns the stored result without computing when ``out`` already holds this run."""
    if (done := stored_result(cfg, out)) is not None:
        return done
    ckpt = Checkpoint(out)
    result = simulate(cfg, ckpt)
    write_json(out, result.to_dict())
    ckpt.clear()
    return result


DEFAULT_RECORDS = 31


def recorded_times(T: float | None, times: ArrayLike | None) -> np.ndarray:
    """The recorded times: ``times`` (checked against T), or equally spaced in [0, T]."""
    if times is None:
        if T is None:
            raise ValidationError("T: give --T (final time > 0) or --times")
        if not np.isfinite(T) or T <= 0:
            raise ValidationError(f"T: must be a finite time > 0 (got {T})")
        return np.linspace(0.0, T, DEFAULT_RECORDS)
    grid = as_finite_array(times, "times", ndim=1)
    if T is not None and (grid.size == 0 or grid[-1] > T + 1e-12):
        shown = ",".join(f"{x:g}" for x in grid)
        raise ValidationError(f"times: must not exceed T = {T} (got {shown!r})")
    return grid
