"""The runs of an E∞ computation in one panel (``EinfResult.plot``).

Each run ends at a fixed point; runs that reach the same one form a group
(``asymptotic.global_min``), and E∞ is the mean over all runs.  The panel shows E at every
run's end point against its seed, one marker and colour per group (hollow: the run is not
certified, so its value has no error bar), the mean as a line, and the floors (E_Bayes,
the global minimum of E) when known.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.axes import Axes

from .style import HEAD_MARKERS, series_colors

# a y range at least this share of |E| wide: runs that agree to 1e-13 otherwise get an
# axis labelled "1e-13 + 3.97e-1" that hides the value itself
MIN_RELATIVE_RANGE = 1e-4


def draw_einf_runs(ax: Axes, seeds: Sequence[int], values: Sequence[float],
                   errors: Sequence[float], certified: Sequence[bool],
                   groups: Sequence[Sequence[int]], floors: dict[str, float | None]) -> None:
    """E at each run's end point against its seed (see the module docstring).

    Parameters
    ----------
    seeds, values, errors, certified : sequences, one entry per run
        The run's seed, E at its end point, the error of E there (inf when not certified)
        and whether it is certified.
    groups : sequence of sequences of int
        The runs (indices) that reach the same fixed point.
    floors : dict
        ``bayes`` and ``global_min`` (None when unknown).
    """
    x = np.arange(len(values))
    colors = series_colors(max(1, len(groups)))
    for k, group in enumerate(groups):
        for ok in (True, False):
            idx = [i for i in group if bool(certified[i]) is ok]
            if not idx:
                continue
            bars = [errors[i] if np.isfinite(errors[i]) else 0.0 for i in idx]
            what = f"end point {k + 1}: {len(group)} run(s)" + ("" if ok else ", not certified")
            ax.errorbar(x[idx], [values[i] for i in idx], yerr=bars, ls="none",
                        marker=HEAD_MARKERS[k % len(HEAD_MARKERS)], ms=6, capsize=3,
                        color=colors[k], mfc=colors[k] if ok else "none", label=what)
    mean = float(np.mean(values))
    ax.axhline(mean, color="0.45", lw=1.0, label=rf"$E_\infty$ = mean over runs = {mean:.6g}")
    lines = {"bayes": ("--", r"$E_{\rm Bayes}$"), "global_min": (":", "global minimum of E")}
    shown = [mean, *values]
    for key, (style, name) in lines.items():
        value = floors.get(key)
        if value is not None and np.isfinite(value):
            ax.axhline(value, color="k", ls=style, lw=1.0, label=f"{name} = {value:.6g}")
            shown.append(value)
    _readable_range(ax, shown)
    ax.set_xticks(x, [str(s) for s in seeds])
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_xlabel("run (seed)")
    ax.set_ylabel("E at the run's end point")


def _readable_range(ax: Axes, shown: Sequence[float]) -> None:
    """y limits around the values, at least :data:`MIN_RELATIVE_RANGE` of |E| wide, and tick
    labels without an offset."""
    finite = np.asarray([v for v in shown if np.isfinite(v)], dtype=float)
    if finite.size:
        low, high = float(finite.min()), float(finite.max())
        half = max(0.6 * (high - low), 0.5 * MIN_RELATIVE_RANGE * max(abs(high), 1e-12))
        middle = 0.5 * (low + high)
        ax.set_ylim(middle - 1.3 * half, middle + 1.3 * half)
    ax.ticklabel_format(axis="y", useOffset=False)
