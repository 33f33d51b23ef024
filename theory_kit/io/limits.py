"""Resource bounds: refuse a request whose estimated memory (or time) exceeds the limit,
before anything is allocated.

The bounds of a call are a :class:`Limits` object: the API verbs take it in their
``run=Run(limits=...)`` option and hold it for the duration of the call (:func:`applied`); the
command line builds it from ``--max-memory`` (``8G``, ``512M``, ``50%``) and ``--yes``.  Without
one, the memory limit is the environment variable ``THEORY_KIT_MAX_MEMORY`` or 50 % of the
physical RAM, and never more than the room left under the process's address-space limit
(``RLIMIT_AS``, ``ulimit -v``) when one is set.
Estimates are from the sizes alone (bytes of the largest arrays a step holds at once);
each check raises :class:`~theory_kit.model.validation.ResourceError` (CLI exit 4) with one line
naming the request, the estimate, the limit and what to change.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

from ..model.validation import ResourceError, ValidationError

DEFAULT_FRACTION = 0.5
MAX_SECONDS = 3600.0  # runs estimated beyond an hour need allow_long (--yes, THEORY_KIT_YES=1)
# A run whose total is known (simulate's steps, the ODE's time) is guarded by its own pilot
# (io.progress.PilotGuard: the hour from the rate measured over its first seconds); up front,
# the reference cost model refuses only what is certainly too long: a model fitted on another
# machine was 45x off for a simulation it called 1.2 hours.
CERTAIN_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class Limits:
    """The resource bounds of one call.

    Parameters
    ----------
    max_memory : str or int, optional
        Refuse requests estimated to need more memory: bytes, or a size such as ``"8G"``,
        ``"512M"`` or ``"30%"`` (of RAM).  None: ``$THEORY_KIT_MAX_MEMORY``, or 50 % of RAM
        and at most the room left under the process's address-space limit (``ulimit -v``).
    allow_long : bool
        Run requests estimated to take over an hour (``--yes`` on the command line).

    Examples
    --------
    >>> Limits(max_memory="1G").memory_bytes()
    1073741824
    """

    max_memory: str | int | None = None
    allow_long: bool = False

    def __post_init__(self) -> None:
        if self.max_memory is not None:     # a bad size is refused when the limits are made
            self.memory_bytes()

    def memory_bytes(self) -> int:
        """The memory limit in bytes."""
        if self.max_memory is None:
            env = os.environ.get("THEORY_KIT_MAX_MEMORY")
            return parse_size(env) if env else default_memory_limit()
        if isinstance(self.max_memory, int) and not isinstance(self.max_memory, bool):
            if self.max_memory <= 0:
                raise ValidationError(f"max-memory: must be > 0 (got {self.max_memory})")
            return self.max_memory
        return parse_size(str(self.max_memory))


def default_memory_limit() -> int:
    """Half the RAM, or less when the process's own address space is capped (``ulimit -v``,
    ``RLIMIT_AS``): the room left under that cap, which the process's mappings (the Python
    runtime, NumPy, numba) already use part of.  A 7.4 GiB request under an 8 GiB cap passed
    the half-of-RAM check and died after 25 s."""
    limit = int(DEFAULT_FRACTION * physical_memory())
    room = address_space_room()
    return limit if room is None else max(1, min(limit, room))


def address_space_room() -> int | None:
    """Bytes the process may still map under its soft ``RLIMIT_AS``, or None without one."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, AttributeError, ValueError, OSError):   # (not on every platform)
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    return int(soft) - mapped_bytes()


def mapped_bytes() -> int:
    """The process's mapped (virtual) memory, from /proc/self/statm (0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[0])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def physical_memory() -> int:
    """Bytes of RAM (``os.sysconf``), or 8 GiB where that is unavailable."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 1024 ** 3


def parse_size(text: str) -> int:
    """``8G``, ``512M``, ``1.5T``, ``123456`` (bytes) or ``30%`` (of RAM) to bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT%]?)[iI]?[bB]?\s*", str(text))
    if not match:
        raise ValidationError(f"max-memory: must be a size such as 8G, 512M or 50% "
                              f"(got {text!r})")
    value, unit = float(match.group(1)), match.group(2).upper()
    if unit == "%":
        size = value / 100 * physical_memory()
    else:
        size = value * 1024 ** " KMGT".index(unit or " ") if unit else value
    if size <= 0:
        raise ValidationError(f"max-memory: must be > 0 (got {text!r})")
    return int(size)


# the limits of the call in progress (a context variable, so that threads and nested calls
# each see their own, and nothing outlives the call)
_ACTIVE: ContextVar[Limits] = ContextVar("theory_kit_limits", default=Limits())


@contextmanager
def applied(limits: Limits) -> Iterator[Limits]:
    """Hold ``limits`` for the checks made inside the ``with`` block."""
    token = _ACTIVE.set(limits)
    try:
        yield limits
    finally:
        _ACTIVE.reset(token)


def memory_limit() -> int:
    """The memory limit in bytes of the call in progress (see :class:`Limits`)."""
    return _ACTIVE.get().memory_bytes()


def human(nbytes: float) -> str:
    for unit, size in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def check_memory(nbytes: float, what: str, hint: str) -> None:
    """Refuse ``what`` when it needs more than the memory limit (one-line ResourceError)."""
    limit = memory_limit()
    if not nbytes <= limit:  # also catches nan/inf from overflowing size products
        raise ResourceError(f"resources: {what} needs about {human(nbytes)} of memory, over the "
                            f"limit of {human(limit)} (--max-memory); {hint}")


REFERENCE_BASIS = ("reference estimate from the cost model of a 2-core reference machine, not a "
                   "measurement of this machine")


def check_time(seconds: float, what: str, hint: str, basis: str = REFERENCE_BASIS,
               limit: float | None = None) -> None:
    """Refuse ``what`` when estimated beyond ``limit`` (default :data:`MAX_SECONDS`, an hour)
    unless the call's limits allow long runs (or THEORY_KIT_YES=1); ``basis`` says in the
    message what the number is."""
    if _ACTIVE.get().allow_long or os.environ.get("THEORY_KIT_YES") == "1":
        return
    if not seconds <= (MAX_SECONDS if limit is None else limit):
        hours = seconds / 3600
        raise ResourceError(f"resources: {what} would take about {hours:.3g} hours ({basis}); "
                            f"{hint}, or pass --yes to run it anyway")


# ----------------------------------------------------------------------------- estimates
# Reference cost model: seconds per elementary operation on a 2-core reference machine
# (rounded up).  It only decides whether a request is refused as longer than an hour, and every
# refusal calls its number a reference estimate; nothing printed as a time of this machine
# comes from it.
SECONDS_PER_SCORE = 5e-8  # one (sample, head, token) score with its weight
SECONDS_PER_KEY_FLOP = 2e-9  # one multiply-add of a D-dimensional SGD step
# One (sample, stratum, head, token) score of a sampled drift, per activation class, and the
# fixed cost of one evaluation.  Measured 2026-12-01 on the block-compiled kernels (CPU time
# by time.process_time over repeated evaluations at 2000 and 20000 samples, H = 2, L = 5,
# flipping prior: 2 strata; slope = per score, intercept = fixed):
#   softmax 1.69e-8 s (fixed 1.1 ms), softmax1 2.01e-8 (1.05 ms), bsoftmax 1.87e-8 (0.36 ms),
#   relu 1.57e-8 (1.3 ms), user phi per-head 1.68e-8 (1.1 ms), joint 1.54e-8 (1.7 ms),
#   elementwise 2.07e-8 (0.47 ms).
# The classes differ by 1.35x at most, so one constant (the largest, rounded up) serves all:
# whole `theory-kit ode` runs (20000 samples, --times 0,T, T = 4 against 40: the slope per
# evaluation) measured 7.7 ms (softmax), 6.3 ms (bsoftmax), 8.4 ms (phi joint) per evaluation
# where the estimate below gives 10.3 ms: estimates are 1.2-1.6x the measured CPU time, never
# below it.  (The constant was 2.5e-7 before the kernel rewrite: ode estimates were 13x long.)
SECONDS_PER_DRIFT_SCORE = 2.2e-8
SECONDS_PER_EVALUATION = 1.5e-3  # fixed cost of one drift evaluation (0.4-1.7 ms measured)
ESTIMATE_FACTOR = 2.0  # measured CPU time <= estimate <= ESTIMATE_FACTOR x measured
SECONDS_PER_REDUCED_STEP = 6e-5  # one run-step of the reduced simulation, H + L = 6 (53 us)
EINF_EVALS_PER_TIME = 2.1  # adaptive ODE evaluations per unit time (291 to T = 140)
# einf's own constant (its per-chunk records and checks cost more per score than a bare
# drift).  Re-checked 2026-12-01 on the block-compiled kernels against the README's einf run
# (B-softmax H = 2, L = 5, 2 runs, warm cache): estimate 23 s, measured 17-31 CPU s.
EINF_SECONDS_PER_DRIFT_SCORE = 2.5e-7
EINF_TYPICAL_T = 200.0  # where einf typically hands over to the solver (T = 140 measured)
SOLVER_EVALUATIONS = 150  # objective + gradient evaluations of one solve (L-BFGS, Newton)


def simulation_bytes(D: int, H: int, L: int, runs: int, method: str,
                     error_samples: int) -> float:
    """Memory of a simulation: ``brute`` keys, gradients and one batch (runs × H × D and
    L × D floats, a few copies); ``reduced`` the Gram matrix of the F + H directions per run
    (no D); both the scores of the recorded population error (error_samples × runs × H × L,
    a few arrays)."""
    if method == "reduced":
        nbytes = 8.0 * runs * (4.0 * (H + L) ** 2 + 64.0)
    else:
        nbytes = 8.0 * D * (4.0 * runs * H + 2.0 * L)
    return nbytes + 8.0 * 4 * float(error_samples) * runs * H * L


def simulation_seconds(D: int, H: int, L: int, runs: int, T: float, method: str) -> float:
    """CPU seconds of T·D SGD steps: ``brute`` about runs·D·(H + L) operations per step,
    ``reduced`` :data:`SECONDS_PER_REDUCED_STEP` per run and step (no D)."""
    steps = float(T) * D
    if method == "reduced":
        return steps * runs * SECONDS_PER_REDUCED_STEP * (H + L) / 6.0
    return steps * runs * D * (H + L) * SECONDS_PER_KEY_FLOP


def check_simulation(D: int, H: int, L: int, runs: int, T: float, method: str = "brute",
                     error_samples: int = 0) -> None:
    """Refuse a simulation over the memory limit or estimated beyond an hour."""
    steps = float(T) * D
    seconds = simulation_seconds(D, H, L, runs, T, method)
    check_memory(simulation_bytes(D, H, L, runs, method, error_samples),
                 f"simulate at D = {D} with {runs} run(s) and H = {H}", "lower --D or --runs")
    check_time(seconds, f"simulate ({method}) for T = {T:g} at D = {D} ({steps:.3g} SGD steps "
               f"x {runs} run(s))", "lower --T, --D or --runs", limit=CERTAIN_SECONDS)


def drift_seconds(samples: int, H: int, L: int, strata: int) -> float:
    """CPU seconds of one sampled drift evaluation: samples × strata × H × L scores at
    :data:`SECONDS_PER_DRIFT_SCORE` each, plus :data:`SECONDS_PER_EVALUATION` of overhead."""
    return float(samples) * strata * H * L * SECONDS_PER_DRIFT_SCORE + SECONDS_PER_EVALUATION


def drift_bytes(samples: int, H: int, L: int, strata: int) -> float:
    """Memory of one sampled drift evaluation: tens of arrays of samples × strata × H × L."""
    return float(samples) * strata * H * L * 8.0 * 40


def check_ode(samples: int, H: int, L: int, strata: int, T: float, dt: float) -> None:
    """The ODE with a sampled drift: four evaluations per RK4 step of at most dt (within
    :data:`ESTIMATE_FACTOR` of the measured CPU time for every activation class; more
    requested times than T/dt add steps the estimate does not count)."""
    check_memory(drift_bytes(samples, H, L, strata), f"the drift with {samples} samples x "
                 f"{strata} theta strata x H = {H} x L = {L}", "lower --samples")
    steps = max(1.0, float(T) / float(dt))
    check_time(4.0 * steps * drift_seconds(samples, H, L, strata),
               f"the ODE to T = {T:g} ({steps:.3g} steps of dt = {dt:g})", "lower --T or --samples",
               limit=CERTAIN_SECONDS)


def einf_seconds(runs: int, samples: int, H: int, L: int, strata: int, T_min: float,
                 T_max: float, solver_points: int, solve: bool, shift_check: bool,
                 minimum_starts: int) -> float:
    """CPU seconds of ``einf``: per run the adaptive ODE (:data:`EINF_EVALS_PER_TIME`
    evaluations per unit time up to a typical hand-over at ``EINF_TYPICAL_T``, or T_max when
    sooner, T_min when later), then the solver (:data:`SOLVER_EVALUATIONS` objective and
    gradient evaluations on solver_points × strata × H × L scores, twice with the shift check),
    and the global minimum (``minimum_starts`` solver runs).  Calibrated on the README's
    B-softmax run (H = 2, L = 5: 291 drift evaluations to T = 140, 25.6 CPU s in all), with
    the ODE's cost per score at :data:`EINF_SECONDS_PER_DRIFT_SCORE` (the value it was
    calibrated with, which covers einf's per-chunk records and checks)."""
    horizon = min(float(T_max), max(float(T_min), EINF_TYPICAL_T))
    per_evaluation = (float(samples) * strata * H * L * EINF_SECONDS_PER_DRIFT_SCORE
                      + SECONDS_PER_EVALUATION)
    ode = EINF_EVALS_PER_TIME * horizon * per_evaluation
    solve_once = SOLVER_EVALUATIONS * float(solver_points) * strata * H * L * SECONDS_PER_SCORE
    solver = solve_once * (2 if shift_check else 1) if solve else 0.0
    return runs * (ode + solver) + minimum_starts * solve_once


def check_einf(runs: int, jobs: int, samples: int, H: int, L: int, strata: int, T_min: float,
               T_max: float, solver_points: int, solve: bool, shift_check: bool,
               minimum_starts: int) -> None:
    """Refuse an ``einf`` request over the memory limit, or estimated beyond an hour."""
    biggest = max(drift_bytes(samples, H, L, strata),
                  drift_bytes(solver_points, H, L, strata) if solve or minimum_starts else 0.0)
    check_memory(biggest * min(jobs, runs), f"einf with {samples} drift samples and "
                 f"{solver_points} solver points x {strata} theta strata x H = {H} x L = {L} "
                 f"({min(jobs, runs)} job(s) at once)",
                 "lower --samples, --solver-points or --jobs")
    seconds = einf_seconds(runs, samples, H, L, strata, T_min, T_max, solver_points, solve,
                           shift_check, minimum_starts) / max(1, min(jobs, runs, cores()))
    check_time(seconds, f"einf with {runs} run(s) of H = {H}, L = {L}",
               "lower --runs, --samples or --solver-points (or add --jobs)")


def rk4_steps(times: ArrayLike, dt: float) -> float:
    """RK4 steps of an ODE recorded at ``times`` (from the first) with steps of at most dt:
    every interval between records takes at least one (``dynamics.ode``'s grid), so a log
    recorded at 20 000 times costs 20 000 steps however short its span."""
    import numpy as np  # (here: importing the toolkit's options loads no NumPy)
    gaps = np.diff(np.asarray(times, dtype=float))
    return float(np.sum(np.maximum(1.0, np.ceil(gaps / float(dt) - 1e-9)))) if gaps.size else 1.0


def compare_seconds(ode_seeds: int, samples: int, H: int, L: int, strata: int,
                    times: ArrayLike, dt: float, D: int, runs: int,
                    error_samples: int) -> float:
    """CPU seconds of ``compare``: ``ode_seeds`` RK4 integrations through the log's times
    (:func:`rk4_steps`, four drift evaluations a step) and ``runs`` reduced simulations over
    its span, which estimate the loss of every run at every recorded time from
    ``error_samples`` draws (:data:`SECONDS_PER_SCORE` per score).  Measured (softmax, H = 2,
    L = 3, D = 1000, the default settings): 100 and 400 records, 12.4 and 48.7 CPU s against
    13.6 and 53 s estimated."""
    import numpy as np
    t = np.asarray(times, dtype=float)
    T = float(t[-1] - t[0])
    ode = ode_seeds * 4.0 * rk4_steps(t, dt) * drift_seconds(samples, H, L, strata)
    records = float(len(t)) * runs * error_samples * H * L * SECONDS_PER_SCORE
    return ode + simulation_seconds(D, H, L, runs, T, "reduced") + records


def check_compare(ode_seeds: int, samples: int, H: int, L: int, strata: int,
                  times: ArrayLike, dt: float, D: int, runs: int, error_samples: int,
                  jobs: int) -> float:
    """``compare``: ``ode_seeds`` RK4 integrations through the log's recorded ``times`` and
    ``runs`` reduced simulations at the log's D, recording their loss from ``error_samples``
    draws at every time (the pieces of one sweep, ``jobs`` at a time).  Refuses a request
    over the memory limit or estimated beyond an hour; returns the estimate in seconds."""
    check_memory(drift_bytes(samples, H, L, strata) * min(jobs, ode_seeds),
                 f"compare's ODE with {samples} samples x {strata} theta strata x H = {H} x "
                 f"L = {L}", "lower --samples or --jobs")
    check_memory(simulation_bytes(D, H, L, runs, "reduced", error_samples),
                 f"compare's {runs} simulations (their loss from {error_samples} draws each)",
                 "lower --runs")
    import numpy as np
    t = np.asarray(times, dtype=float)
    T = float(t[-1] - t[0])
    seconds = compare_seconds(ode_seeds, samples, H, L, strata, t, dt, D, runs,
                              error_samples) / max(1, min(jobs, ode_seeds + 1, cores()))
    check_time(seconds, f"compare over t = {T:g} with {len(t)} recorded times "
               f"({ode_seeds} ODE seeds of {rk4_steps(t, dt):.3g} steps, {runs} "
               f"simulations of {T * D:.3g} steps at D = {D}, each recording its loss at "
               f"every time)", "lower --samples or --runs, or record fewer times")
    return seconds


def check_figure(seconds: float, number: int, quick: bool, jobs: int) -> None:
    """A figure whose reference estimate (``figN.estimate_seconds``: the CPU seconds of its
    cost model on the reference machine, one core) is beyond an hour even with ``jobs``
    cores; the message says the hours are that reference estimate, not a measurement of this
    machine."""
    shared = max(1, min(jobs, cores()))
    check_time(seconds / shared, f"figure {number}{' --quick' if quick else ''}",
               "run it with --quick or more --jobs",
               basis=f"reference estimate from the figure's cost model, its reference CPU time "
                     f"shared among {shared} job(s); not a measurement of this machine")


def cores() -> int:
    """Cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_monte_carlo(n: int, H: int, L: int, what: str = "Monte Carlo") -> None:
    """n samples of H × L scores, processed in chunks (memory bounded, time not)."""
    check_time(float(n) * H * L * SECONDS_PER_SCORE, f"{what} with {n} samples of H = {H} x "
               f"L = {L} scores", "lower n (--samples) or L")


# ----------------------------------------------------------------------------- engines
# Bytes one deterministic-engine evaluation (``expect.laplace``) may hold at once: the engine
# cuts its u grid into windows to stay below (``_Engine.bounded``).  A quarter of the limit,
# so that two jobs and their callers' arrays fit, and at most 1 GiB (a drift along Fig. 1
# holds ~0.1 GB; at key norm 10 the whole grid needs ~1 GB).
ENGINE_MEMORY = 1 << 30


def engine_memory_budget() -> int:
    """Bytes per engine evaluation: min(:data:`ENGINE_MEMORY`, memory limit / 4)."""
    return int(min(ENGINE_MEMORY, memory_limit() / 4))
