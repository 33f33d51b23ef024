"""One place that builds a drift engine by name: ``mc``, ``quad``, ``sobol``, ``rqmc``,
``laplace``, ``auto``.

Every caller (the ``ode`` and ``drift`` verbs, the figure pieces, ``comparison``, ``einf``)
asks :func:`build_engine` for its drift expectations, so the engine choice, its validation and
the record of what was chosen live here only.

* ``mc``: :class:`~theory_kit.expect.drift.MonteCarloDrift`, ``samples`` noise draws (each
  paired with every θ stratum), fixed along a trajectory or ``fresh`` at every evaluation;
  honest standard errors.
* ``quad``: :class:`~theory_kit.expect.drift.QuadratureDrift`, tensor Gauss–Hermite when the
  Gaussian dimension is ≤ 6 (error estimate: the change to coarser rules), otherwise
  ``samples`` scrambled Sobol points (error estimate: the spread of independently scrambled
  replicates that share the points).
* ``sobol``: ``samples`` scrambled Sobol points at every dimension (replicate error estimate).
* ``rqmc``: :class:`~theory_kit.expect.rqmc.AdaptiveQmcDrift`, independently scrambled Sobol
  replicates, reflected, grown until every drift component's error is below ``tol`` (or the
  ``budget`` of points per replicate is spent).
* ``laplace``: the deterministic engine ``expect.laplace.LaplaceDrift`` (imported lazily), with
  an absolute error estimate per field; refused where it does not apply.
* ``auto``: ``laplace`` where it applies and where it is faster than sampling at the accuracy
  asked for, otherwise ``rqmc`` at ``tol`` (``mc`` when fresh samples are asked for).  The
  accuracy asked for is ε = max(ε_L, tol): a deterministic engine more precise than ``tol``
  is not worth a higher price.  "Faster" is measured, once, at a probe state (the caller's
  state when given): one laplace evaluation takes t_L and reaches ε_L (its largest error
  estimate); one ``rqmc`` evaluation at its target takes t_S
  (:func:`compare_at_equal_accuracy`).  The probe's numbers and the reason of the choice are
  recorded in ``params()``.

``head_symmetric`` pairs every sample with its head permutations (sample engines only; the
deterministic engine is head-symmetric by construction).
"""
from __future__ import annotations

import importlib
import time
from typing import Any, Protocol

import numpy as np

from ..model.activations import Activation
from ..model.state import State
from ..model.task import Task
from ..model.validation import ValidationError, check_int, fail
from .drift import DriftMeans, MonteCarloDrift, QuadratureDrift
from .rqmc import DEFAULT_MAX_POINTS, DEFAULT_START_POINTS, DEFAULT_TOL, AdaptiveQmcDrift

ENGINE_NAMES = ("auto", "laplace", "mc", "quad", "rqmc", "sobol")
DEFAULT_QMC_POINTS = 2 ** 15  # Sobol points of ``quad`` when the caller has no count


class DriftEngine(Protocol):
    """The duck type every engine has (see ``expect.drift.SampleDrift``)."""

    @property
    def fresh(self) -> bool: ...               # an attribute, or auto's read-only property

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans: ...

    def params(self) -> dict: ...


def laplace_class() -> type | None:
    """``expect.laplace.LaplaceDrift`` when that module is installed, else None."""
    try:
        module = importlib.import_module("theory_kit.expect.laplace")
    except ImportError:
        return None
    return getattr(module, "LaplaceDrift", None)


def laplace_applies(task: Task, act: Activation, H: int) -> tuple[bool, str]:
    """Whether the deterministic engine covers (task, act, H), and why not when it does not
    (``applies`` may return a bool, with the reason from ``reason``, or a (bool, reason))."""
    cls = laplace_class()
    if cls is None:
        return False, "the deterministic engine (expect.laplace) is not installed"
    engine = cls()
    result = engine.applies(task, act, H)
    ok, reason = result if isinstance(result, tuple) else (bool(result), "")
    if not ok and not reason and hasattr(engine, "reason"):
        reason = engine.reason(task, act, H)
    return bool(ok), reason or ("applies" if ok else "outside the deterministic engine's class")


def largest_error(means: DriftMeans) -> float:
    """The largest error estimate among the fields of one evaluation (inf when non-finite)."""
    errs = [float(np.max(np.abs(v))) if np.size(v) else 0.0 for v in means.stderr.values()]
    worst = max(errs, default=0.0)
    return worst if np.isfinite(worst) else float("inf")


def probe_state(task: Task, act: Activation, H: int) -> State:
    """A generic state for the auto probe: small overlaps m_hf = 0.2 (alternating signs along
    f ≥ 2, so the heads differ), Q = I/2 + MMᵀ, the activation's a and b."""
    M = 0.2 * np.ones((H, task.F))
    M[1::2, 1:] *= -1.0
    Q = 0.5 * np.eye(H) + M @ M.T
    return State(M, Q, act.a_default(H, task.L), act.b_default(H, task.L))


def _timed(engine: DriftEngine, task: Task, act: Activation, state: State
           ) -> tuple[float, DriftMeans]:
    start = time.perf_counter()
    means = engine.evaluate(task, act, state.M, state.Q, state.a, state.b)
    return time.perf_counter() - start, means


class SelectedEngine:
    """An engine picked by ``auto``: evaluates as the chosen one and records why in
    ``params()``; the probe's timings (which vary from run to run, so they are not a
    parameter) are in ``probe``."""

    def __init__(self, inner: DriftEngine, selection: dict) -> None:
        self.inner = inner
        self.probe = selection.pop("probe", None)
        self.selection = selection

    @property
    def fresh(self) -> bool:
        return bool(self.inner.fresh)

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        return self.inner.evaluate(task, act, M, Q, a, b)

    def params(self) -> dict:
        return {**self.inner.params(), "requested": "auto", "selection": self.selection}

    def __getattr__(self, name: str) -> Any:  # rng_state etc. of the chosen engine
        return getattr(self.inner, name)


def sample_engine(name: str, samples: int = 20_000, seed: int = 0, fresh: bool = False,
                  head_symmetric: bool = False, tol: float = DEFAULT_TOL,
                  budget: int = DEFAULT_MAX_POINTS) -> DriftEngine:
    """The sample engines: ``mc``, ``quad`` (Gauss–Hermite, Sobol beyond dimension 6) or
    ``sobol`` (Sobol at every dimension) with ``samples`` points, or ``rqmc`` to the error
    target ``tol`` with at most ``budget`` points per replicate."""
    samples = check_int(samples, "samples", 2)
    if name == "mc":
        return MonteCarloDrift(samples, seed=seed, fresh=fresh, head_symmetric=head_symmetric)
    if fresh:
        fail("engine", "fresh samples exist only for the mc engine", name)
    if name == "rqmc":
        return AdaptiveQmcDrift(tol, max_points=budget, seed=seed,
                                head_symmetric=head_symmetric,
                                start_points=min(budget, DEFAULT_START_POINTS))
    if name == "quad":
        return QuadratureDrift(qmc_points=samples, seed=seed, head_symmetric=head_symmetric)
    if name == "sobol":
        return QuadratureDrift(max_tensor_dim=1, qmc_points=samples, seed=seed,
                               head_symmetric=head_symmetric, name="sobol")
    fail("engine", f"must be one of {', '.join(ENGINE_NAMES)}", name)
    raise AssertionError  # unreachable


def build_engine(name: str = "mc", task: Task | None = None, act: Activation | None = None,
                 H: int | None = None, samples: int = 20_000, seed: int = 0,
                 fresh: bool = False, head_symmetric: bool = False,
                 state: State | None = None, tol: float = DEFAULT_TOL,
                 budget: int = DEFAULT_MAX_POINTS) -> DriftEngine:
    """The drift engine ``name`` (one of :data:`ENGINE_NAMES`).

    ``task``, ``act`` and ``H`` are needed by ``laplace`` (to refuse what it does not cover)
    and ``auto`` (to choose); ``state`` is the probe state of ``auto`` (default
    :func:`probe_state`).  ``samples``, ``seed``, ``fresh`` and ``head_symmetric`` configure the
    sample engines (``fresh`` only ``mc``; ``auto`` with ``fresh`` is ``mc``); ``tol`` and
    ``budget`` the ``rqmc`` engine, and ``tol`` also ``auto``'s choice."""
    if not isinstance(name, str) or name not in ENGINE_NAMES:
        fail("engine", f"must be one of {', '.join(ENGINE_NAMES)}", name)
    if name == "laplace":
        return _laplace(task, act, H, fresh)
    if name == "auto":
        return _auto(task, act, H, samples, seed, fresh, head_symmetric, state, tol, budget)
    return sample_engine(name, samples, seed, fresh, head_symmetric, tol, budget)


def engine_from_options(options: Any, task: Task, act: Activation, H: int,
                        state: State | None = None) -> DriftEngine:
    """:func:`build_engine` from a :class:`theory_kit.options.Engine` (validated by the API).

    Examples
    --------
    >>> from theory_kit.options import Engine
    >>> from theory_kit.model.activations import get_activation
    >>> from theory_kit.model.priors import make_prior
    >>> eng = engine_from_options(Engine("rqmc", tol=1e-3), Task(3, make_prior("flipping",
    ...                           nu=[2.0])), get_activation("softmax"), 2)
    >>> eng.params()["tol"]
    0.001
    """
    return build_engine(options.name, task, act, H, samples=options.samples,
                        seed=check_int(options.seed, "mc-seed", 0), fresh=options.fresh,
                        head_symmetric=options.symmetric_heads, state=state, tol=options.tol,
                        budget=options.budget)


def _laplace(task: Task | None, act: Activation | None, H: int | None,
             fresh: bool) -> DriftEngine:
    cls = laplace_class()
    if cls is None:
        fail("engine", "laplace needs theory_kit.expect.laplace (not installed); use auto, mc, "
                       "quad or sobol", "laplace")
    if fresh:
        fail("engine", "the laplace engine is deterministic (no fresh samples); use mc",
             "laplace")
    if task is not None and act is not None and H is not None:
        ok, reason = laplace_applies(task, act, H)
        if not ok:
            fail("engine", f"laplace does not apply here ({reason}); use auto or mc", "laplace")
    return cls()


def _auto(task: Task | None, act: Activation | None, H: int | None, samples: int, seed: int,
          fresh: bool, head_symmetric: bool, state: State | None, tol: float = DEFAULT_TOL,
          budget: int = DEFAULT_MAX_POINTS) -> DriftEngine:
    if fresh:
        return SelectedEngine(sample_engine("mc", samples, seed, fresh, head_symmetric),
                              {"engine": "mc", "reason": "fresh samples requested"})
    fallback = sample_engine("rqmc", samples, seed, False, head_symmetric, tol, budget)
    if task is None or act is None or H is None:
        raise ValidationError("engine: auto needs the task, the activation and H to choose")
    ok, reason = laplace_applies(task, act, H)
    if not ok:
        return SelectedEngine(fallback, {"engine": "rqmc", "reason": reason})
    cls = laplace_class()
    assert cls is not None                       # laplace_applies found it
    laplace = cls()
    probe = compare_at_equal_accuracy(laplace, fallback, task, act,
                                      probe_state(task, act, H) if state is None else state,
                                      tol)
    if probe["laplace_seconds"] <= probe["sample_seconds_at_equal_accuracy"]:
        return SelectedEngine(laplace, {"engine": "laplace", "reason": "applies, and faster "
                                        "than sampling at the accuracy asked for",
                                        "probe": probe})
    return SelectedEngine(fallback, {"engine": "rqmc", "reason": "sampling is faster at the "
                                     "accuracy asked for", "probe": probe})


def compare_at_equal_accuracy(deterministic: DriftEngine, sampled: DriftEngine, task: Task,
                              act: Activation, state: State, tol: float = 0.0) -> dict:
    """Time one evaluation of each engine at ``state``, and the sample engine's time to reach
    ε = max(the deterministic engine's largest error estimate, ``tol``).

    The sample engine is the one the run would use (``rqmc`` grows its points to its target
    on a first evaluation, which also builds its point sets; the second is timed).  If its
    error σ is still above ε (a spent budget), its time is scaled as t_S (σ/ε)², the
    Monte Carlo rate, which is conservative for quasi-Monte Carlo."""
    t_det, det = _timed(deterministic, task, act, state)
    _timed(sampled, task, act, state)
    t_smp, smp = _timed(sampled, task, act, state)
    eps, sigma = max(largest_error(det), tol), largest_error(smp)
    if not np.isfinite(eps):
        needed = 0.0
    else:
        needed = t_smp * max(1.0, (sigma / max(eps, 1e-300)) ** 2)
    return {"state": state.to_dict(), "laplace_seconds": t_det,
            "laplace_abs_err": largest_error(det), "tol": tol,
            "sample_seconds": t_smp, "sample_engine": sampled.params().get("engine"),
            "sample_stderr": sigma, "sample_seconds_at_equal_accuracy": float(needed)}
