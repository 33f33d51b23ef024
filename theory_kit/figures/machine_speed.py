"""How fast this machine does the toolkit's kind of work, relative to the reference host.

The printed run-time estimates (``theory-kit figure``: ``figures.runner.estimate``) are cost
models whose constants are seconds measured on one machine, the *reference host*.  Hosts
differ: the project's 2-core machines went from an Intel Xeon (Emerald Rapids; the constants'
host, 2026-12-01 to 12-04) to an AMD EPYC (Zen 4, 2026-12-05), on which the cold quick figures
ran at 0.45–1.26 of their estimates, outside the factor 1.5 the estimates promise for 10 of
the 14.  So an estimate is scaled by

    speed = t_probe(this machine) / t_probe(reference host),

where ``t_probe`` is the best of :data:`REPEATS` timings of a fixed workload with the three
kinds of work a run is made of (each part ~10–20 ms on the reference host):

* Python: a loop of scalar arithmetic and calls (numba's typing and the figures' bookkeeping);
* small calls: many NumPy operations on arrays of a few elements (the per-step overhead of
  the solvers and the ODE, which dominates e.g. Fig. 4's quick plan);
* bulk arithmetic: ``exp`` and products over an array of 4·10⁵ numbers and a sort (the
  vectorised expectations; the compiled kernels scale like it; no BLAS call, whose thread
  count would make the probe depend on the environment).

``speed`` is the geometric mean of the three parts' ratios.  :data:`REFERENCE_SECONDS` are not a
timing on the reference host itself (it is gone): they are this probe's timings on the
2026-12-05 host divided by that host's measured speed, :data:`FITTED_SPEED` — the geometric
mean over the 14 cold quick figures of measured wall / estimate in reference seconds (after
the compile constants were re-measured, ``figures.runner``) — i.e. the probe times the
reference host would have shown if the probe scales like the figures.
A loaded machine probes slower, so the estimate grows with the load, as the run will.

``THEORY_KIT_SPEED`` (a positive number) replaces the probe, e.g. ``1`` for the reference
host's estimates (tests, reproducible printouts).
"""
from __future__ import annotations

import functools
import math
import os
import time
from typing import Callable

import numpy as np

from ..model.validation import ValidationError

REPEATS = 5
# the 2026-12-05 host (AMD EPYC, 2 cores): the 14 cold quick figures ran at 0.85–1.22 x 0.538
# of their estimates in reference seconds (figures/README.md, "Run time of the quick figures")
FITTED_SPEED = 0.538
# per part: the probe on that host (best of 5, idle, four processes: python 4.84–5.10 ms,
# small calls 6.98–7.37 ms, bulk 5.21–5.58 ms) / FITTED_SPEED
REFERENCE_SECONDS = {"python": 5.0e-3 / FITTED_SPEED, "small": 7.2e-3 / FITTED_SPEED,
                     "bulk": 5.3e-3 / FITTED_SPEED}
ENV = "THEORY_KIT_SPEED"


def _python_part() -> float:
    def step(x: float, i: int) -> float:
        return x * 0.999 + (i % 7) * 1e-3

    x = 0.0
    for i in range(60_000):
        x = step(x, i)
    return x


def _small_part(values: np.ndarray) -> float:
    v, m = values[:4], values[:16].reshape(4, 4)
    total = 0.0
    for _ in range(1500):
        w = np.exp(v - v.max())
        total += float(np.dot(m @ w, w / w.sum()))
    return total


def _bulk_part(x: np.ndarray) -> float:
    y = np.exp(-0.5 * x * x) * x
    return float(np.sort(y[:50_000]).sum() + y.sum())


def _best(fn: Callable[..., float], *args: object) -> float:
    best = math.inf
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def probe_seconds() -> dict[str, float]:
    """Best-of-:data:`REPEATS` seconds of each part of the probe on this machine (~0.1 s)."""
    rng = np.random.default_rng(0)
    small = rng.standard_normal(16)
    x = rng.standard_normal(400_000)
    return {"python": _best(_python_part), "small": _best(_small_part, small),
            "bulk": _best(_bulk_part, x)}


def _from_environment(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValidationError(f"{ENV}: must be a positive number, the machine's time relative to "
                              f"the reference host's (got {text!r})")
    return value


@functools.cache
def speed() -> float:
    """This machine's time for the toolkit's work relative to the reference host (< 1: faster):
    ``$THEORY_KIT_SPEED`` if set, else the geometric mean over the probe's parts of
    t(this machine) / t(reference host).  Measured once per process."""
    text = os.environ.get(ENV)
    if text is not None and text.strip():
        return _from_environment(text)
    times = probe_seconds()
    logs = [math.log(times[k] / REFERENCE_SECONDS[k]) for k in REFERENCE_SECONDS]
    return math.exp(sum(logs) / len(logs))
