"""Shared matplotlib look for every figure module: one style, labelled axes, legends."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, cast

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

RC: dict[RcKeyType, Any] = {
    "figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.grid": True,
    "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.frameon": False, "legend.fontsize": 9, "lines.linewidth": 1.6}
# the smallest text any figure writes (legends, annotations, cell labels), in points at the
# saved size: below 9 pt a figure is not readable when printed at its natural size
SMALL = 9
# heads are told apart by line style and marker as well as colour (grey print, colour blindness)
HEAD_LINESTYLES = ("-", "--", "-.", ":")
HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def new_figure(nrows: int = 1, ncols: int = 1, panel_size: tuple[float, float] = (3.2, 2.6),
               extra_width: float = 0.0) -> tuple[Figure, list[Axes]]:
    """A figure with a grid of panels (flattened list of axes) in the shared style,
    ``extra_width`` inches wider than the panels (room for a legend right of them)."""
    with plt.rc_context(RC):
        fig, axes = plt.subplots(nrows, ncols, squeeze=False,
                                 figsize=(panel_size[0] * ncols + extra_width,
                                          panel_size[1] * nrows))
    for ax in axes.flat:
        ax.grid(True, alpha=RC["grid.alpha"])
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return fig, list(axes.flat)


def label_axes(ax: Axes, xlabel: str, ylabel: str, title: str | None = None,
               legend: bool = True) -> None:
    """Axis labels, optional title, and a legend when the panel has labelled artists."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=RC["font.size"])
    if legend and ax.get_legend_handles_labels()[0]:
        legend_below(ax)


def legend_below(ax: Axes, ncol: int = 2) -> None:
    """ax's legend under its x label, outside the data ("best" inside a panel still covered
    points), in as many columns (at most ``ncol``) as fit the panel's width.  The offset is
    in points below the axes, so it survives ``tight_layout``, which makes room for it."""
    fig = cast(Figure, ax.figure)   # the figures draw on top-level figures, never subfigures
    legend = ax.get_legend()
    if legend is not None:
        legend.remove()
    box = ax.get_window_extent()
    tight = ax.get_tightbbox()
    assert tight is not None   # None only for an invisible axes, which gets no legend
    drop = (box.y0 - tight.y0) * 72 / fig.dpi
    handles, labels = labelled_handles(ax)
    cols = _fitting_columns(fig, handles, labels, ncol, box.width)
    ax.legend(handles, labels, loc="upper center", ncol=cols, fontsize=SMALL, frameon=False,
              bbox_to_anchor=(0.5, 0.0), borderaxespad=0.0,
              bbox_transform=offset_copy(ax.transAxes, fig=fig, y=-(drop + 4), units="points"))


def head_style(j: int) -> dict:
    """Line style and marker of head (or series) j, cycling independently of its colour."""
    return {"ls": HEAD_LINESTYLES[j % len(HEAD_LINESTYLES)],
            "marker": HEAD_MARKERS[j % len(HEAD_MARKERS)]}


LEGEND_WIDTH = 2.3  # inches kept right of a row of panels for its legend


def legend_right(ax: Axes, source: Axes | Sequence[Axes] | None = None) -> None:
    """A legend right of ax, outside the data, of the labelled artists of ``source`` (one
    axes or several, default ax itself; see :func:`labelled_handles`); make the figure
    :data:`LEGEND_WIDTH` wider for it (``new_figure(..., extra_width=LEGEND_WIDTH)``)."""
    handles, labels = labelled_handles(source if source is not None else ax)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.04, 1.0), fontsize=SMALL,
              frameon=False, borderaxespad=0.0)


def labelled_handles(source: Axes | Sequence[Axes]) -> tuple[list[Any], list[str]]:
    """The labelled artists of one or several axes, each label once, in drawing order.

    Artists of one axes that share a label become one entry drawn on top of each other
    (a quantile band and its median markers, say): a figure's legend then names every
    series it draws once, whichever panels it comes from."""
    axes = [source] if isinstance(source, Axes) else list(source)
    order: list[str] = []
    groups: dict[str, list[Any]] = {}
    for ax in axes:
        seen_here: dict[str, list[Any]] = {}
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            seen_here.setdefault(label, []).append(handle)
        for label, found in seen_here.items():
            if label not in groups:
                order.append(label)
                groups[label] = found
    return [groups[k][0] if len(groups[k]) == 1 else tuple(groups[k]) for k in order], order


def legend_under_figure(fig: Figure, source: Axes | Sequence[Axes] | None,
                        ncol: int = 6,
                        entries: tuple[list[Any], list[str]] | None = None) -> None:
    """One legend for the whole figure under its panels, of the labelled artists of
    ``source`` (one axes or several, see :func:`labelled_handles`) or of the given
    ``entries`` (handles, labels); the figure grows by the legend's height and
    ``tight_layout`` keeps the panels above it.  Without entries only the layout is
    tightened."""
    if entries is None:
        entries = labelled_handles(source) if source is not None else ([], [])
    handles, labels = entries
    if not handles:
        fig.tight_layout()
        return
    ncol = _fitting_columns(fig, handles, labels, ncol, fig.bbox.width)
    lines = -(-len(handles) // ncol)
    extra = 0.22 * lines + 0.2
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + extra)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=SMALL, frameon=False)
    fig.tight_layout(rect=(0.0, extra / (height + extra), 1.0, 1.0))


def _fitting_columns(fig: Figure, handles: list, labels: list, ncol: int,
                     width: float) -> int:
    """The most columns, at most ``ncol``, for which a legend of these entries is at most
    ``width`` pixels wide (a narrow figure with many heads cut its last entries off)."""
    for cols in range(min(ncol, len(handles)), 1, -1):
        trial = fig.legend(handles, labels, ncol=cols, fontsize=SMALL, frameon=False)
        wide = trial.get_window_extent().width
        trial.remove()
        if wide <= width:
            return cols
    return 1


def series_colors(n: int) -> Sequence:
    """n distinguishable colours (one per head or curve)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "viridis")
    return [cmap(i if n <= 10 else i / max(1, n - 1)) for i in range(n)]
