"""The ODE watches its own drift error: is a direction decided by sampling noise?

Near a symmetric state (a plateau: M = 0 for an even φ, or heads with equal overlaps) the
drift along a symmetry-breaking direction is small, and a sampled drift can have the wrong
sign there.  The trajectory then leaves the plateau the wrong way, with nothing in its
numbers to show it.  At every record the watch looks at

* each overlap m_{hf}, and
* each head difference m_{hf} − m_{gf} (g > h),

and flags the one whose error exceeds a third of its drift (the sign is then not resolved at
3σ) while it is near its symmetric value (|·| < :data:`SMALL`) and growing: larger by a
fraction :data:`GROWTH` than at the last record, or at the first record.  A component that
shrinks or stands still is at or near a stable point, where a drift of the size of the error
only shifts the point by error/curvature and decides nothing.  The error of a difference is
the sum of the two errors (a bound).  Not flagged either: an error below :data:`FLOOR`, and a
direction whose value and drift are both 0 up to rounding (:data:`HELD`: a symmetry of the
point set, e.g. head permutations at a head-symmetric state, holds it there).  Deterministic engines
(``deterministic = True``) are not watched: their error is a bound, not noise, and their
symmetries are exact.

What happens to a flagged direction:

1. an engine that can tighten (``rqmc``: ``tighten``) gets a target below the drift, and the
   record is evaluated again, within the engine's budget;
2. if that does not resolve it, a warning goes to stderr and into the trajectory's
   ``stats["warnings"]``: "m_{3,1}: the direction is decided by sampling error near
   t ≈ 0.5 …; rerun with --tol 1e-05".

A sampled engine that spent its budget without meeting its target is reported the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..expect.drift import DriftMeans
from ..io.progress import note

if TYPE_CHECKING:
    from .ode import OdeSystem

RATIO = 3.0      # error above |drift| / RATIO: the drift's sign is not resolved
SMALL = 0.1      # a component this close to its symmetric value 0 is near the plateau
GROWTH = 1e-3    # |component| grew by more than this fraction since the last record
# an error below this (per unit time) moves an overlap by less than 1e-4 over t = 100, below
# any finite-D spread: such a direction is resolved whatever its drift
FLOOR = 1e-6
# a direction whose value and drift are both below this is held at 0 by an exact symmetry of
# the point set, up to rounding (a head difference along a head-symmetric trajectory: a
# rounding error of 1e-16 grows to 1e-13 over the escape theory's T = 400)
HELD = 1e-12


@dataclass(frozen=True)
class Direction:
    """One watched direction at one record: its value, drift and error bound."""

    label: str
    value: float
    drift: float
    error: float


def directions(M: np.ndarray, dM: np.ndarray, errM: np.ndarray) -> list[Direction]:
    """m_{hf} and m_{hf} − m_{gf} (g > h) with their drifts and error bounds.

    Parameters
    ----------
    M, dM, errM : ndarray, shape (H, F)
        The overlaps, their drift dM/dt and its error estimate.

    Examples
    --------
    >>> import numpy as np
    >>> ds = directions(np.array([[0.1], [0.3]]), np.ones((2, 1)), np.full((2, 1), 0.1))
    >>> [(d.label, round(d.value, 3), d.error) for d in ds]
    [('m_{1,1}', 0.1, 0.1), ('m_{2,1}', 0.3, 0.1), ('m_{1,1} - m_{2,1}', -0.2, 0.2)]
    """
    H, F = M.shape
    out = [Direction(f"m_{{{h + 1},{f + 1}}}", float(M[h, f]), float(dM[h, f]),
                     float(errM[h, f])) for h in range(H) for f in range(F)]
    for f in range(F):
        for h in range(H):
            for g in range(h + 1, H):
                out.append(Direction(f"m_{{{h + 1},{f + 1}}} - m_{{{g + 1},{f + 1}}}",
                                     float(M[h, f] - M[g, f]), float(dM[h, f] - dM[g, f]),
                                     float(errM[h, f] + errM[g, f])))
    return out


def suggested_tol(drift: float) -> float:
    """A power of ten at most |drift| / (RATIO + 1), and at least :data:`FLOOR` / 10 (an
    error below the floor resolves any direction).

    >>> suggested_tol(6.3e-4), suggested_tol(0.0)
    (0.0001, 1e-07)
    """
    target = max(abs(drift) / (RATIO + 1), FLOOR / 10)
    return float(10.0 ** math.floor(math.log10(target)))


@dataclass
class DriftWatch:
    """The record-by-record check of the module docstring; ``warnings`` are the messages."""

    previous: dict[str, float] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)

    def unresolved(self, M: np.ndarray, dM: np.ndarray, errM: np.ndarray) -> list[Direction]:
        """The flagged directions at this record (module docstring)."""
        flagged = []
        for d in directions(M, dM, errM):
            if abs(d.value) <= HELD and abs(d.drift) <= HELD:
                continue   # held at its symmetric value by the point set's symmetry
            before = self.previous.get(d.label)
            growing = before is None or abs(d.value) > (1 + GROWTH) * abs(before)
            if (d.error > max(abs(d.drift) / RATIO, FLOOR) and abs(d.value) < SMALL
                    and growing):
                flagged.append(d)
        return flagged

    def check(self, system: OdeSystem, t: float, y: np.ndarray, means: DriftMeans
              ) -> DriftMeans:
        """Check the record at (t, y); tighten the engine and evaluate again where it can.
        Returns the drift of the record (the new one when it was evaluated again)."""
        if getattr(system.engine, "deterministic", False):
            return means
        M = system.split(y)[0]
        rate = abs(system.rate)
        flagged = self.unresolved(M, rate * means.dM, rate * _err(means))
        tighten = getattr(system.engine, "tighten", None)
        if flagged and tighten is not None and not system.engine_exhausted():
            tighten(min(suggested_tol(d.drift / max(rate, 1e-300)) for d in flagged))
            means = system.means(t, y, again=True)
            flagged = self.unresolved(M, rate * means.dM, rate * _err(means))
        self._report(t, [d for d in flagged if d.label not in self.warned], rate)
        self._check_budget(system, t)
        self.previous = {d.label: d.value for d in directions(M, M, np.zeros_like(M))}
        return means

    def _report(self, t: float, new: list[Direction], rate: float) -> None:
        """One message per record for the directions not reported before: each in the JSON,
        one line on stderr (the worst first: the smallest drift against its error)."""
        if not new:
            return
        new = sorted(new, key=lambda d: abs(d.drift) / d.error)
        for d in new:
            self.warned.add(d.label)
            self.warnings.append(f"{d.label}: the direction is decided by sampling error near "
                                 f"t ≈ {t:.3g} (drift {d.drift:.2g} ± {d.error:.2g}); rerun "
                                 f"with --tol {suggested_tol(d.drift / max(rate, 1e-300)):.0e}")
        worst = new[0]
        others = f" and {len(new) - 1} more (listed in the result's stats)" if len(new) > 1 else ""
        note(f"warning: near t ≈ {t:.3g} the direction of {worst.label}{others} is decided by "
             f"sampling error (drift {worst.drift:.2g} ± {worst.error:.2g}); rerun with --tol "
             f"{min(suggested_tol(d.drift / max(rate, 1e-300)) for d in new):.0e}")

    def _check_budget(self, system: OdeSystem, t: float) -> None:
        accuracy = system.engine_accuracy()
        if accuracy and not accuracy["met"]:
            why = ("the memory one evaluation may use (io.limits.engine_memory_budget; "
                   "--max-memory) stops it" if accuracy.get("limited_by") == "memory"
                   else "the budget is spent (raise --budget, or loosen --tol)")
            self._warn("budget", f"the drift error {accuracy['error']:.2g} is above the target "
                                 f"{accuracy['tol']:.2g} from t ≈ {t:.3g} on, at "
                                 f"{accuracy['points']} points per replicate: {why}")

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.warnings.append(message)
            note(f"warning: {message}")


def _err(means: DriftMeans) -> np.ndarray:
    return np.abs(np.asarray(means.stderr.get("dM", np.zeros_like(means.dM)), dtype=float))
