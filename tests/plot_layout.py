"""A layout check for any matplotlib figure the toolkit draws (issue #42 §4).

:func:`layout_problems` renders a figure with its own canvas and returns what a reader would
trip over, one sentence each (an empty list is a pass):

* **text cut off** by the figure's edge (tick labels included);
* **overlapping text**: titles, axis labels, annotations, the suptitle and whole legends
  whose boxes intersect, or an axis label or title over another panel (its data area or its
  tick labels: "a y label over the next panel").  Tick labels among themselves are left out
  (a crowded axis is matplotlib's own business);
* **a legend over data**: a legend's box over a drawn point of any panel: line vertices,
  line segments (sampled every few pixels), markers, collection offsets and paths, images;
* **a panel without an x label**: every visible panel with data and x tick labels;
* **a series missing from the legend**: every line, collection, patch and container drawn
  in a panel must be named by a legend of the figure, by its label, by the label of the
  container it belongs to (an errorbar, a histogram), by looking like a named artist of
  the same panel (per-run traces of which only the first is labelled), or by a colour and
  a marker that the legend names apart (colour: activation, marker: kind of run);
* **a legend entry twice**: one legend naming two series alike ("ODE, ODE") says nothing
  about which is which.  Images and
  colour-mapped artists are explained by a colour bar, not a legend, and are not asked for.

Everything is measured in display coordinates after ``fig.canvas.draw()``, so what is
checked is what the PNG shows (the figure's dpi, its size after ``tight_layout``).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Iterator

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import Collection, PathCollection
from matplotlib.colors import to_rgba
from matplotlib.container import Container
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

# boxes that share less than this many pixels (each way) only touch: anti-aliasing and the
# padding of text boxes make touching boxes common and harmless
TOUCH = 1.0
# line segments are sampled this densely (pixels) for the legend-over-data check
SAMPLE_STEP = 3.0


@dataclass(frozen=True)
class Box:
    """A named box on the canvas: ``owner`` is the axes it belongs to (None for the figure)."""

    name: str
    bbox: Bbox
    owner: Axes | None


def layout_problems(fig: Figure) -> list[str]:
    """Every layout problem of ``fig`` at its saved size (see the module docstring)."""
    fig.canvas.draw()
    return (overlapping_text(fig) + text_outside_figure(fig) + legends_over_data(fig)
            + panels_without_x_label(fig) + series_missing_from_legend(fig)
            + repeated_legend_entries(fig))


# ----------------------------------------------------------------------------- helpers
def panels(fig: Figure) -> list[Axes]:
    """The visible axes that are panels: colour bars are excluded (they label an image)."""
    return [ax for ax in fig.axes if ax.get_visible() and not is_colorbar(ax)]


def is_colorbar(ax: Axes) -> bool:
    # matplotlib marks the axes a Colorbar draws on (mpl >= 3.6)
    return getattr(ax, "_colorbar", None) is not None


def legends(fig: Figure) -> list[Legend]:
    out = list(fig.legends)
    out += [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [leg for leg in out if leg.get_visible()]


def legend_labels(fig: Figure) -> set[str]:
    return {t.get_text() for leg in legends(fig) for t in leg.get_texts()}


def _shown(text: Text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def _overlap(a: Bbox, b: Bbox) -> bool:
    """Whether two boxes share more than :data:`TOUCH` pixels both ways."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w > TOUCH and h > TOUCH


def _label_of(text: Text) -> str:
    return repr(text.get_text()[:40])


# ----------------------------------------------------------------------------- text
def text_boxes(fig: Figure) -> list[Box]:
    """Titles, axis labels, free texts and annotations of every axes, the figure's texts
    (the suptitle among them) and each legend as one box."""
    renderer = fig.canvas.get_renderer()   # type: ignore[attr-defined]
    boxes: list[Box] = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        own = [ax.title, ax._left_title, ax._right_title,   # type: ignore[attr-defined]
               ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for text in own:
            if _shown(text):
                boxes.append(Box(f"text {_label_of(text)}", text.get_window_extent(renderer), ax))
    for text in fig.texts:
        if _shown(text):
            boxes.append(Box(f"figure text {_label_of(text)}", text.get_window_extent(renderer),
                             None))
    for leg in legends(fig):
        owner = leg.axes if leg.axes is not None and leg in [a.get_legend() for a in fig.axes] \
            else None
        first = next((t.get_text() for t in leg.get_texts()), "")
        boxes.append(Box(f"legend ({first[:30]!r}…)", leg.get_window_extent(renderer), owner))
    return boxes


def tick_label_boxes(ax: Axes) -> list[Bbox]:
    """The boxes of the tick labels ``ax`` draws (matplotlib keeps labels of ticks outside
    the view limits too, which it does not draw)."""
    renderer = ax.figure.canvas.get_renderer()   # type: ignore[attr-defined]
    out = []
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        slack = 1e-9 * max(1.0, abs(high - low))
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            if not low - slack <= tick.get_loc() <= high + slack:
                continue
            for label in (tick.label1, tick.label2):
                if _shown(label):
                    out.append(label.get_window_extent(renderer))
    return out


def overlapping_text(fig: Figure) -> list[str]:
    """Text boxes that intersect each other, a label or title over another panel's data
    area, and any text box (a legend too) over another panel's tick labels."""
    boxes = text_boxes(fig)
    problems = [f"{a.name} overlaps {b.name}" for a, b in combinations(boxes, 2)
                if _overlap(a.bbox, b.bbox)]
    renderer = fig.canvas.get_renderer()   # type: ignore[attr-defined]
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        area = ax.get_window_extent(renderer)
        ticks = tick_label_boxes(ax)
        for box in boxes:
            if box.owner is ax:
                continue
            # a legend over a panel's area is judged by what it covers (legends_over_data)
            if not box.name.startswith("legend") and _overlap(box.bbox, area):
                problems.append(f"{box.name} lies over panel {i}")
            elif any(_overlap(box.bbox, tick) for tick in ticks):
                problems.append(f"{box.name} overlaps the tick labels of panel {i}")
    return problems


def text_outside_figure(fig: Figure) -> list[str]:
    """Text (tick labels too) and legends that the figure's edge cuts off: an x label
    below the canvas, a legend right of it."""
    edge = fig.bbox
    boxes = [(b.name, b.bbox) for b in text_boxes(fig)]
    boxes += [(f"tick label of panel {i}", tick) for i, ax in enumerate(fig.axes)
              if ax.get_visible() for tick in tick_label_boxes(ax)]
    return [f"{name} is cut off by the figure's edge" for name, box in boxes
            if box.x0 < edge.x0 - TOUCH or box.y0 < edge.y0 - TOUCH
            or box.x1 > edge.x1 + TOUCH or box.y1 > edge.y1 + TOUCH]


# ----------------------------------------------------------------------------- legend over data
def _densify(points: np.ndarray, step: float = SAMPLE_STEP) -> np.ndarray:
    """Points every ``step`` pixels along the polyline through ``points`` (display space)."""
    points = points[np.all(np.isfinite(points), axis=1)]
    if len(points) < 2:
        return points
    out = [points[:1]]
    for a, b in zip(points[:-1], points[1:]):
        n = max(1, int(np.hypot(*(b - a)) // step))
        out.append(a + (b - a) * (np.arange(1, n + 1)[:, None] / n))
    return np.concatenate(out)


def data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of what ``ax`` draws as data, clipped to the axes' area."""
    chunks: list[np.ndarray] = []
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        joined = line.get_linestyle() not in ("None", "none", "", " ")
        chunks.append(_densify(xy) if joined else xy)
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):   # markers (scatter): their positions
            offsets = np.asarray(coll.get_offsets(), dtype=float)
            chunks.append(coll.get_offset_transform().transform(offsets))
            continue
        transform = coll.get_transform()
        for path in coll.get_paths():
            chunks.append(_densify(transform.transform(np.asarray(path.vertices, float))))
    for image in ax.get_images():
        x0, x1, y0, y1 = image.get_extent()
        corners = ax.transData.transform([[x0, y0], [x1, y1]])
        xs = np.linspace(corners[0, 0], corners[1, 0], 20)
        ys = np.linspace(corners[0, 1], corners[1, 1], 20)
        chunks.append(np.array([(x, y) for x in xs for y in ys]))
    chunks = [c.reshape(-1, 2) for c in chunks if c.size]
    if not chunks:
        return np.empty((0, 2))
    pts = np.concatenate(chunks)
    area = ax.get_window_extent()
    inside = ((pts[:, 0] >= area.x0 - 1) & (pts[:, 0] <= area.x1 + 1)
              & (pts[:, 1] >= area.y0 - 1) & (pts[:, 1] <= area.y1 + 1))
    return pts[inside]


def legends_over_data(fig: Figure) -> list[str]:
    """A legend (of a panel or of the figure) whose box holds a drawn data point."""
    renderer = fig.canvas.get_renderer()   # type: ignore[attr-defined]
    problems = []
    for leg in legends(fig):
        box = leg.get_window_extent(renderer)
        for i, ax in enumerate(panels(fig)):
            pts = data_points(ax)
            hit = ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1)
                   & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1))
            if hit.any():
                first = next((t.get_text() for t in leg.get_texts()), "")
                problems.append(f"legend ({first[:30]!r}…) covers {int(hit.sum())} data "
                                f"points of panel {i}")
    return problems


# ----------------------------------------------------------------------------- x labels
def has_data(ax: Axes) -> bool:
    return bool(ax.get_lines() or ax.collections or ax.patches or ax.get_images())


def panels_without_x_label(fig: Figure) -> list[str]:
    """Panels with data and x tick labels but no x label."""
    problems = []
    for i, ax in enumerate(panels(fig)):
        ticks = [t for t in ax.xaxis.get_ticklabels() if _shown(t)]
        if has_data(ax) and ticks and not ax.xaxis.label.get_text().strip():
            problems.append(f"panel {i} ({ax.get_title()[:30]!r}) has no x label")
    return problems


# ----------------------------------------------------------------------------- legend entries
def _style(artist: Artist) -> tuple:
    """What tells an artist apart at a glance: colour, line style, marker."""
    if isinstance(artist, Line2D):
        return ("line", _rgb(artist.get_color()), artist.get_linestyle(), artist.get_marker())
    if isinstance(artist, Collection):
        face = artist.get_facecolor()
        edge = artist.get_edgecolor()
        colour = face[0] if len(face) else (edge[0] if len(edge) else (0, 0, 0, 0))
        return ("collection", _rgb(colour))
    if isinstance(artist, Patch):
        return ("patch", _rgb(artist.get_facecolor()))
    return ("other", type(artist).__name__)


def _rgb(colour: object) -> tuple:
    return tuple(np.round(to_rgba(colour)[:3], 3))   # type: ignore[arg-type]


def drawn_series(ax: Axes) -> Iterator[tuple[Artist, Container | None]]:
    """(artist, the container it belongs to) of everything ``ax`` draws as data."""
    owner: dict[int, Container] = {}
    for container in ax.containers:
        for child in container.get_children():
            owner[id(child)] = container
    artists: Iterable[Artist] = [*ax.get_lines(), *ax.collections, *ax.patches]
    for artist in artists:
        if not artist.get_visible():
            continue
        if isinstance(artist, Line2D) and len(artist.get_xdata()) == 0:
            continue
        if isinstance(artist, Collection) and artist.get_array() is not None:
            continue   # colour-mapped: a colour bar explains it
        yield artist, owner.get(id(artist))


def _named(ax: Axes, named: set[str]) -> list[Artist]:
    """The artists of ``ax`` (empty proxies included) whose label a legend shows, and the
    members of containers whose label it shows."""
    out = [a for a in [*ax.get_lines(), *ax.collections, *ax.patches] if a.get_label() in named]
    for container in ax.containers:
        if container.get_label() in named:
            out += container.get_children()
    return out


def _shape(artist: Artist) -> tuple | None:
    """A line's marker and line style (the shape a legend entry can name on its own)."""
    if isinstance(artist, Line2D):
        return (artist.get_linestyle(), artist.get_marker())
    return None


def series_missing_from_legend(fig: Figure) -> list[str]:
    """Drawn series that no legend of the figure names (see the module docstring).

    A series counts as named by its label, its container's label, a named artist of the
    same panel that looks the same (colour, line style, marker), or, the usual two-key
    legend, a named artist of the same panel in its colour together with a named artist
    anywhere in the figure of its shape (a grey marker standing for "not certified")."""
    named = legend_labels(fig)
    shapes = {_shape(a) for ax in panels(fig) for a in _named(ax, named)} - {None}
    problems = []
    for i, ax in enumerate(panels(fig)):
        known = _named(ax, named)
        styles = {_style(a) for a in known}
        colours = {_style(a)[1] for a in known}
        missing: dict[str, int] = {}
        for artist, container in drawn_series(ax):
            label = container.get_label() if container is not None else artist.get_label()
            style = _style(artist)
            if label in named or style in styles or (
                    style[1] in colours and _shape(artist) in shapes):
                continue
            key = f"{type(artist).__name__} {label!r}"
            missing[key] = missing.get(key, 0) + 1
        problems += [f"panel {i}: {n} × {key} drawn but not in any legend"
                     for key, n in missing.items()]
    return problems


def repeated_legend_entries(fig: Figure) -> list[str]:
    """Legends that show the same text for two entries."""
    problems = []
    for leg in legends(fig):
        texts = [t.get_text() for t in leg.get_texts()]
        problems += [f"legend names {text!r} {texts.count(text)} times"
                     for text in sorted(set(texts)) if texts.count(text) > 1]
    return problems
