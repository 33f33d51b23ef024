"""Shared matplotlib look for every figure module: one style, labelled axes, legends."""
from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

RC = {"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.grid": True,
      "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
      "legend.frameon": False, "legend.fontsize": 8, "lines.linewidth": 1.6}


def new_figure(nrows: int = 1, ncols: int = 1, panel_size: tuple[float, float] = (3.2, 2.6)
               ) -> tuple[Figure, list[Axes]]:
    """A figure with a grid of panels (flattened list of axes) in the shared style."""
    with plt.rc_context(RC):
        fig, axes = plt.subplots(nrows, ncols, squeeze=False,
                                 figsize=(panel_size[0] * ncols, panel_size[1] * nrows))
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
        ax.legend(fontsize=RC["legend.fontsize"], frameon=False)


def series_colors(n: int) -> Sequence:
    """n distinguishable colours (one per head or curve)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "viridis")
    return [cmap(i if n <= 10 else i / max(1, n - 1)) for i in range(n)]
