"""Where a normalised φ ≥ 0 comes near zero, and the score resolution that asks for.

The Laplace tables hold e^{−tφ(s)} for t = e^u up to ~30/κ (beyond, e^{−κt} kills the
integrand).  Where φ touches zero (φ = s², s² σ(s)), e^{−tφ} at large t is a narrow peak about
the zero, of half-width w where tφ ≈ 1; the score trapezoid resolves it only with a step
≲ w, so the rules of ``engine`` are refined by :func:`zero_resolution` (docs/theory.md §5).
φ > 0 everywhere (every preset) or κ = 0 leave the rules exactly as they were.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize

from ...model.activations import Activation, lambdify_numpy

PROBE = np.linspace(-40.0, 40.0, 801)   # where φ's sign and zeros are checked
ZERO_TOL = 1e-10                 # an interior minimum of φ at or below this counts as a zero
MAX_REFINED = 64                 # local minima refined by ``phi_minimum`` (a periodic φ: the
                                 # lowest 64 of its ~25 per 2π)
TAIL = 30.0                      # e^{−κt} < 1e−13 beyond t = TAIL/κ: the largest t that matters
MAX_RESOLUTION = 16.0            # factor^H beyond its square is refused (``ladder.
                                 # applicability``): the H-D score rules cost factor^H (φ = s²,
                                 # H = 2, L = 6, warm: κ = 0.01, factor 12.5, 0.9–3.7 CPU s a
                                 # drift against 0.03–0.06 at κ = 1)
FLAT = 1.5                       # ``flat_zero``: w beyond this × its quadratic prediction
WIDTH_REF = 1.25 * math.sqrt(1.0 / TAIL)
# ... 1.25 × the half-width of the peak e^{−tφ} at t = TAIL/κ for φ = s², κ = 1: a narrower
# peak refines the score rules by WIDTH_REF/w (φ = s²: 1.25/√κ).  Measured at H = 1, L = 3
# against level 4: with the default rules φ = s², κ = 1 was off by 3e−8 at level 1 and the
# ladder ended above its tol (abs_err 3e−8), κ = 0.01 by 2e−2 (abs_err 3e−2); with the factor
# κ = 1, 0.1, 0.01 are off by ≤ 8e−11 at level 1 and ≤ 2e−14 at level 4/3


def phi_minimum(act: Activation, interior: bool = False) -> tuple[float, float]:
    """(min φ, argmin) on [−40, 40]: φ on ``PROBE``, each interior local minimum refined by
    bounded Brent between its probe neighbours (a zero between probe points, as in
    (s − 0.05)², is found; a dip below 0 there too); NaN if φ is NaN somewhere.

    With ``interior``, the lowest refined local minimum only ((inf, nan) if there is none):
    φ = eˢ has min 4e−18 at −40, an end of the probe, but no interior minimum.

    Examples
    --------
    >>> from theory_kit.model.activations import custom_activation
    >>> low, where = phi_minimum(custom_activation("(s - 0.05)**2", kappa=1.0))
    >>> bool(low < 1e-12), round(where, 6)
    (True, 0.05)
    >>> phi_minimum(custom_activation("exp(s)"), interior=True)
    (inf, nan)
    """
    with np.errstate(all="ignore"):
        vals = act.phi_numpy(PROBE)
    if np.any(np.isnan(vals)):
        return float("nan"), float(PROBE[int(np.argmax(np.isnan(vals)))])
    i = int(np.argmin(vals))
    low, where = (np.inf, np.nan) if interior else (float(vals[i]), float(PROBE[i]))
    minima = _local_minima(act)
    return min((low, where), minima[0]) if minima else (low, where)


def _local_minima(act: Activation) -> list[tuple[float, float]]:
    """(φ, s) at the refined interior local minima on ``PROBE`` (lowest first)."""
    with np.errstate(all="ignore"):
        vals = act.phi_numpy(PROBE)
    mins = np.nonzero((vals[1:-1] < vals[:-2]) & (vals[1:-1] <= vals[2:]))[0] + 1
    out = []
    for j in mins[np.argsort(vals[mins], kind="stable")][:MAX_REFINED]:
        res = optimize.minimize_scalar(lambda x: float(act.phi_numpy(np.array([x]))[0]),
                                       bounds=(PROBE[j - 1], PROBE[j + 1]), method="bounded",
                                       options={"xatol": 1e-12})
        out.append(min((float(res.fun), float(res.x)), (float(vals[j]), float(PROBE[j]))))
    return sorted(out)


@lru_cache(maxsize=32)
def touches_zero(act: Activation) -> bool:
    """Whether φ is 0 somewhere on ``PROBE`` or has an interior minimum ≤ ``ZERO_TOL``
    (the class that needs κ > 0; every preset is outside it).

    Examples
    --------
    >>> from theory_kit.model.activations import custom_activation, get_activation
    >>> touches_zero(custom_activation("(s - 0.05)**2", kappa=1.0))
    True
    >>> touches_zero(get_activation("softmax1"))
    False
    """
    with np.errstate(all="ignore"):
        vals = act.phi_numpy(PROBE)
    return bool(not np.all(vals > 0) or phi_minimum(act, interior=True)[0] <= ZERO_TOL)


@lru_cache(maxsize=32)
def _peaks(act: Activation) -> tuple[tuple[float, float, float], ...]:
    """(s*, w, w₂) per interior local minimum s* of φ with φ(s*) ≤ κ/``TAIL``: the half-width
    w of {s : φ(s) − φ(s*) ≤ κ/TAIL} (the narrower side; inf if φ stays that low for 80) and
    its quadratic prediction w₂ = √(2κ/(TAIL φ''(s*))) (inf if φ''(s*) ≤ 0)."""
    if act.norm == "elementwise" or act.kappa <= 0:
        return ()
    rise = act.kappa / TAIL
    second = lambdify_numpy(act.scalar_derivatives[2])
    out = []
    for low, s0 in _local_minima(act):
        if low > rise:
            break

        def above(x: float) -> float:
            return float(act.phi_numpy(np.array([x]))[0]) - low - rise

        width = np.inf
        for sign in (1.0, -1.0):
            step = 1e-3
            while step < 80.0 and above(s0 + sign * step) < 0:
                step *= 2.0
            if step >= 80.0:
                continue                 # φ stays within κ/TAIL of its minimum: a wide peak
            lo = step / 2.0 if step > 1e-3 else 0.0
            width = min(width, optimize.brentq(lambda d: above(s0 + sign * d), lo, step,
                                               xtol=1e-14))
        curv = float(np.asarray(second(np.array([s0]))).ravel()[0])
        out.append((s0, width, math.sqrt(2.0 * rise / curv) if curv > 0 else np.inf))
    return tuple(out)


def flat_zero(act: Activation) -> float | None:
    """A zero s* of φ flatter than quadratic at the scale that matters (w > ``FLAT`` w₂, as
    for s⁴, where φ''(0) = 0), else None.  The refinement of :func:`zero_resolution` is
    measured on quadratic zeros only: at s⁴, κ = 0.1 the ladder stopped at abs_err 4e−3 (its
    error 5.5e−4), so ``ladder.applicability`` refuses such a φ.

    Examples
    --------
    >>> from theory_kit.model.activations import custom_activation
    >>> flat_zero(custom_activation("s**4", kappa=0.1))
    0.0
    >>> flat_zero(custom_activation("s**2", kappa=0.1)) is None
    True
    """
    for s0, width, quad in _peaks(act):
        if np.isfinite(width) and not width <= FLAT * quad < np.inf:
            return round(s0, 9) + 0.0
    return None


@lru_cache(maxsize=32)
def zero_resolution(act: Activation) -> float:
    """The factor (≥ 1) on the score rules' resolution that a φ touching zero asks for.

    At each interior local minimum s* of φ with φ(s*) ≤ κ/``TAIL`` the half-width w of
    {s : φ(s) − φ(s*) ≤ κ/TAIL} (the peak of e^{−tφ} at the largest t that matters) is found,
    and the factor is max(1, ``WIDTH_REF``/min w): for φ = s² it is max(1, 1.25/√κ).  1.0
    exactly when κ = 0 or φ has no such minimum (every preset): the rules are unchanged.

    Examples
    --------
    >>> from theory_kit.model.activations import custom_activation
    >>> round(zero_resolution(custom_activation("s**2", kappa=0.01)), 6)
    12.5
    >>> zero_resolution(custom_activation("exp(s)", kappa=1.0))
    1.0
    """
    widths = [w for _, w, _ in _peaks(act)]
    width = min(widths, default=np.inf)
    return max(1.0, WIDTH_REF / width) if np.isfinite(width) else 1.0
