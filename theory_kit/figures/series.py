"""Drawing time series of several heads: theory lines, and SGD runs summarised honestly.

Every ODE-against-SGD plot (``Trajectory.plot``, ``Simulation.plot``, ``compare.png``, the
overlay rows of Figs. 1, 9, 10) draws its panels with these pieces, so they read the same:

* one colour, line style and marker per head (:func:`series_style`), and near-black for a
  single series such as the error E;
* the theory as lines, labelled ``"<name> h = 1"`` (``"<name>: E"`` for the error);
* SGD runs as a **quantile band** (10–90 % of the runs, markers at the median) where the runs
  agree, and as **each run's trace** where they break a symmetry in different ways (heads
  that swap roles or signs between runs, :func:`runs_disagree`): a band over both branches
  would straddle them, and a mean would sit between them where no run goes.  The legend
  entry says which summary a panel shows.

A legend built with :func:`theory_kit.figures.style.labelled_handles` names each series once
(a band and its markers share a label and one legend entry).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .style import SMALL, head_style, labelled_handles, legend_under_figure, series_colors

QUANTILES = (0.1, 0.9)          # the band of the runs
BAND_TEXT = "10–90 %"
ERROR_COLOR = "0.2"             # a panel with one series (the error E): near-black
BAND_ALPHA = 0.2
TRACE_ALPHA = 0.45
# runs "disagree" where the spread of a head across runs is this many times the spread of
# the heads' sorted magnitudes (what is left once heads may swap roles and signs) ...
DISAGREE_FACTOR = 2.0
# ... and that spread is at least this share of the panel's range (not noise around zero)
DISAGREE_SHARE = 0.1


def series_style(j: int, n_series: int) -> dict[str, Any]:
    """Colour, line style and marker of series j of n: per head, or near-black for one."""
    if n_series == 1:
        return {"color": ERROR_COLOR, "ls": "-", "marker": "o"}
    return {"color": series_colors(n_series)[j], **head_style(j)}


def series_name(j: int, n_series: int) -> str:
    """``h = j + 1`` for a head, ``E`` for the single series of the error panel."""
    return "E" if n_series == 1 else f"h = {j + 1}"


def series_label(prefix: str, j: int, n_series: int, what: str = "") -> str:
    """The legend text of series j: ``"ODE h = 1"``, ``"ODE: E"``, with ``what`` in brackets."""
    name = series_name(j, n_series)
    text = f"{prefix}: {name}" if n_series == 1 else f"{prefix} {name}"
    return f"{text} ({what})" if what else text


def draw_lines(ax: Axes, t: np.ndarray, values: np.ndarray, prefix: str,
               what: str = "") -> None:
    """The theory (times × series) as one line per series, in the series' style, labelled
    by :func:`series_label` (``what`` in brackets)."""
    values = np.asarray(values, dtype=float).reshape(len(t), -1)
    n = values.shape[-1]
    for j in range(n):
        style = series_style(j, n)
        # above the SGD bands and traces, which would otherwise hide the theory
        ax.plot(t, values[:, j], color=style["color"], ls=style["ls"], zorder=3,
                label=series_label(prefix, j, n, what))


def draw_points(ax: Axes, t: np.ndarray, values: np.ndarray, prefix: str) -> None:
    """One run (times × series) as markers with a dark edge: the user's own data."""
    values = np.asarray(values, dtype=float).reshape(len(t), -1)
    n = values.shape[-1]
    for j in range(n):
        style = series_style(j, n)
        ax.plot(t, values[:, j], style["marker"], ls="none", ms=4.5, color=style["color"],
                mec="k", mew=0.6, label=series_label(prefix, j, n), zorder=4)


def quantile_band(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, median, high) over the runs (axis 0) at :data:`QUANTILES`, NaNs ignored."""
    with np.errstate(invalid="ignore"):
        low, mid, high = np.nanquantile(runs, [QUANTILES[0], 0.5, QUANTILES[1]], axis=0)
    return low, mid, high


def runs_disagree(runs: np.ndarray) -> bool:
    """Whether the runs (runs × times × series) break a symmetry in different ways.

    Heads of an attention layer may swap roles, and along a flipping direction take either
    sign, from run to run.  Then the spread of a head's value across runs is much larger than
    the spread of the sorted magnitudes |value| of the heads, which forgets both choices.
    Ignored where the spread is below :data:`DISAGREE_SHARE` of the panel's range."""
    runs = np.asarray(runs, dtype=float)
    if runs.ndim != 3 or runs.shape[0] < 2 or not np.isfinite(runs).any():
        return False

    def width(v: np.ndarray) -> np.ndarray:
        low, _, high = quantile_band(v)
        return np.nanmax(high - low, axis=-1)          # per time, the widest series

    raw, canonical = width(runs), width(np.sort(np.abs(runs), axis=-1))
    scale = float(np.nanmax(runs) - np.nanmin(runs))
    if not np.isfinite(scale) or scale == 0:
        return False
    with np.errstate(invalid="ignore"):
        split = (raw > DISAGREE_SHARE * scale) & (raw > DISAGREE_FACTOR * canonical)
    return bool(np.any(split))


def draw_band(ax: Axes, t: np.ndarray, low: np.ndarray, high: np.ndarray,
              mid: np.ndarray | None, style: dict[str, Any], label: str) -> None:
    """A shaded band from low to high and, when given, markers at ``mid``; both carry
    ``label`` (one legend entry)."""
    ax.fill_between(t, low, high, color=style["color"], alpha=BAND_ALPHA, lw=0, label=label)
    if mid is not None:
        ax.plot(t, mid, style["marker"], ls="none", ms=3, color=style["color"], label=label)


def draw_traces(ax: Axes, t: np.ndarray, runs: np.ndarray, style: dict[str, Any], label: str,
                markers: bool = True) -> None:
    """Every run (runs × times) as a thin faint line; only the first carries the label."""
    for r, run in enumerate(runs):
        ax.plot(t, run, color=style["color"], lw=0.7, alpha=TRACE_ALPHA,
                marker=style["marker"] if markers else None, ms=2.2,
                label=label if r == 0 else None)


def draw_runs(ax: Axes, t: np.ndarray, runs: np.ndarray, prefix: str,
              markers: bool = True) -> str:
    """SGD runs (runs × times × series): a quantile band per series (markers at the median
    with ``markers``) where the runs agree, every run's trace where they disagree
    (:func:`runs_disagree`).  Returns the summary drawn: ``"band"`` or ``"each run"``."""
    runs = np.asarray(runs, dtype=float).reshape(runs.shape[0], len(t), -1)
    n, count = runs.shape[-1], runs.shape[0]
    if count > 1 and runs_disagree(runs):
        for j in range(n):
            draw_traces(ax, t, runs[:, :, j], series_style(j, n),
                        series_label(prefix, j, n, f"each of {count} runs"), markers)
        return "each run"
    for j in range(n):
        low, mid, high = quantile_band(runs[:, :, j])
        what = f"{BAND_TEXT} of {count} runs" + (", median" if markers else "")
        draw_band(ax, t, low, high, mid if markers else None, series_style(j, n),
                  series_label(prefix, j, n, what))
    return "band"


def draw_mean_std(ax: Axes, t: np.ndarray, mean: np.ndarray, std: np.ndarray,
                  prefix: str) -> None:
    """SGD as mean ± std over runs (times × series) where only those were kept: a band
    around markers at the mean (the band does not hide the theory's lines as bars did)."""
    mean = np.asarray(mean, dtype=float).reshape(len(t), -1)
    std = np.nan_to_num(np.asarray(std, dtype=float).reshape(len(t), -1))
    n = mean.shape[-1]
    for j in range(n):
        draw_band(ax, t, mean[:, j] - std[:, j], mean[:, j] + std[:, j], mean[:, j],
                  series_style(j, n), series_label(prefix, j, n, "mean ± std"))


# ----------------------------------------------------------------------------- the legend
def legend_rank(label: str) -> int:
    """The order of a series legend's groups: theory, SGD summaries, each run, the rest
    (labels of other names keep their drawing order)."""
    if label.startswith(("theory", "ODE")):
        return 0
    if label.startswith("SGD"):
        return 2 if "each" in label else 1
    return 3


def ranked_handles(axes: Sequence[Axes], rank: Callable[[str], int] = legend_rank
                   ) -> tuple[list[Any], list[str]]:
    """:func:`labelled_handles` of the axes, sorted by ``rank`` of the label (stable)."""
    handles, labels = labelled_handles(axes)
    order = sorted(range(len(labels)), key=lambda i: rank(labels[i]))
    return [handles[i] for i in order], [labels[i] for i in order]


def series_legend(fig: Figure, axes: Sequence[Axes], heads: int,
                  rank: Callable[[str], int] = legend_rank) -> None:
    """One legend for the whole figure under its panels naming every series of ``axes``
    once, grouped by ``rank``, in lines of ``heads`` + 1 entries (a head panel's series and
    the error's) so that its columns read theory | SGD | each run | ...."""
    handles, labels = ranked_handles(axes, rank)
    legend_under_figure(fig, None, ncol=max(1, -(-len(labels) // (heads + 1))),
                        entries=(handles, labels))


def series_legend_right(ax: Axes, axes: Sequence[Axes],
                        rank: Callable[[str], int] = legend_rank) -> None:
    """The same legend right of ``ax`` (for axes a caller laid out: it stays inside what
    ``tight_layout`` sees)."""
    handles, labels = ranked_handles(axes, rank)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.04, 1.0), frameon=False,
              borderaxespad=0.0, fontsize=SMALL)
