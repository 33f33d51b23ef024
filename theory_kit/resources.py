"""Resource bounds: refuse a request whose estimated memory (or time) exceeds the limit,
before anything is allocated.

The memory limit is ``--max-memory`` on the command line (``8G``, ``512M``, ``50%``), the
environment variable ``THEORY_KIT_MAX_MEMORY`` or, by default, 50 % of the physical RAM.
Estimates are from the sizes alone (bytes of the largest arrays a step holds at once);
each check raises :class:`~theory_kit.model.ResourceError` (CLI exit 4) with one line
naming the request, the estimate, the limit and what to change.
"""
from __future__ import annotations

import os
import re

from .model import ResourceError, ValidationError

DEFAULT_FRACTION = 0.5
MAX_SECONDS = 3600.0  # runs estimated beyond an hour need THEORY_KIT_YES=1 / --yes
_limit: int | None = None
_yes = False


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


def set_memory_limit(text: str | None) -> None:
    """Set the limit for this process (None: back to the default)."""
    global _limit
    _limit = None if text is None else parse_size(text)


def set_yes(yes: bool) -> None:
    """``--yes``: run requests estimated beyond :data:`MAX_SECONDS` anyway."""
    global _yes
    _yes = bool(yes)


def memory_limit() -> int:
    """The memory limit in bytes (see the module docstring)."""
    if _limit is not None:
        return _limit
    env = os.environ.get("THEORY_KIT_MAX_MEMORY")
    return parse_size(env) if env else int(DEFAULT_FRACTION * physical_memory())


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


def check_time(seconds: float, what: str, hint: str) -> None:
    """Refuse ``what`` when estimated beyond :data:`MAX_SECONDS` unless THEORY_KIT_YES=1."""
    if _yes or os.environ.get("THEORY_KIT_YES") == "1":
        return
    if not seconds <= MAX_SECONDS:
        hours = seconds / 3600
        raise ResourceError(f"resources: {what} would take about {hours:.3g} hours (estimate); "
                            f"{hint}, or pass --yes to run it anyway")


# ----------------------------------------------------------------------------- estimates
# seconds per elementary operation, measured on this project's 2-core machine (rounded up)
SECONDS_PER_SCORE = 5e-8  # one (sample, head, token) score with its weight
SECONDS_PER_KEY_FLOP = 2e-9  # one multiply-add of a D-dimensional SGD step


def check_simulation(D: int, H: int, L: int, runs: int, T: float) -> None:
    """SGD at dimension D: keys, gradients and one batch (runs × H × D and L × D floats,
    a few copies) in memory; T·D steps of about runs·D·(H + L) operations each."""
    nbytes = 8.0 * D * (4.0 * runs * H + 2.0 * L)
    check_memory(nbytes, f"simulate at D = {D} with {runs} run(s) and H = {H}",
                 "lower --D or --runs")
    steps = float(T) * D
    check_time(steps * runs * D * (H + L) * SECONDS_PER_KEY_FLOP,
               f"simulate for T = {T:g} at D = {D} ({steps:.3g} SGD steps)", "lower --T or --D")


def check_ode(samples: int, H: int, L: int, strata: int, T: float, dt: float) -> None:
    """The ODE with a sampled drift: samples × strata × H × L scores (tens of arrays of
    them) per evaluation, four evaluations per RK4 step of at most dt."""
    per_eval = float(samples) * strata * H * L
    check_memory(per_eval * 8.0 * 40, f"the drift with {samples} samples x {strata} theta "
                 f"strata x H = {H} x L = {L}", "lower --samples")
    steps = max(1.0, float(T) / float(dt))
    check_time(4.0 * steps * per_eval * SECONDS_PER_SCORE * 5,
               f"the ODE to T = {T:g} ({steps:.3g} steps of dt = {dt:g})", "lower --T or --samples")


def check_monte_carlo(n: int, H: int, L: int, what: str = "Monte Carlo") -> None:
    """n samples of H × L scores, processed in chunks (memory bounded, time not)."""
    check_time(float(n) * H * L * SECONDS_PER_SCORE, f"{what} with {n} samples of H = {H} x "
               f"L = {L} scores", "lower n (--samples) or L")
