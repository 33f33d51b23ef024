"""The one base of every verb's result: provenance, saving, reloading, a summary, plots.

Each verb of :mod:`theory_kit.api` returns the domain object its solver computes (a
:class:`~theory_kit.dynamics.ode.Trajectory`, a :class:`~theory_kit.dynamics.simulate.Simulation`,
an :class:`~theory_kit.asymptotic.runs.EinfResult`, ...), and each of them is a :class:`Result`:

* it prints as a short summary (the setting, the engine, the key numbers and their errors);
* ``.params`` holds every input, ``.version`` and ``.code_digest`` the code that computed it;
* ``.save(path)`` writes the strict JSON file the command line writes, and :func:`load` reads
  any result file (from the API or the command line) back into its type;
* ``.plot()`` draws its standard panels and ``.to_xarray()`` gives labelled arrays, where the
  result has them.

The results of verbs whose solver returns a plain record (drift, escape, compare, derive,
figure) are :class:`Record` subclasses that keep that record as their data; ``figure all``
returns a :class:`GalleryResult`, which lists the figures' results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..model.validation import ValidationError
from .results import read_json, restore_non_finite, stamps, strict_payload, write_json

PROVENANCE = ("version", "code_digest")


class Result:
    """Base of every result: provenance, saving and a summary.

    Subclasses define :meth:`to_dict` (the file's content without provenance), the class
    method :meth:`from_dict` and ``params``; a result computed in this process carries this
    code's stamps, a reloaded one those of the file.
    """

    kind: ClassVar[str] = "result"
    params: dict
    provenance: dict
    #: True when the verb found this result stored by an identical earlier call
    reused: ClassVar[bool] = False

    def to_dict(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        raise NotImplementedError

    @property
    def version(self) -> str | None:
        """The toolkit version that computed the result."""
        return self.provenance.get("version")

    @property
    def code_digest(self) -> str | None:
        """SHA-256 of the toolkit's sources that computed the result (the version number
        alone does not change with every code change)."""
        return self.provenance.get("code_digest")

    @property
    def data(self) -> dict:
        """The content of the result file, as strict JSON values (NaN and ±inf as null)."""
        return strict_payload({**self.to_dict(), **self.provenance})

    def save(self, path: str | Path) -> Path:
        """Write the result as the command line writes it (strict JSON, atomically).

        Returns the path written."""
        return write_json(path, {**self.provenance, **self.to_dict()})

    def summary(self) -> str:
        return f"{type(self).__name__}()"

    def __repr__(self) -> str:
        return self.summary()

    def plot(self, other: Result | None = None, ax: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no standard plot")

    def to_xarray(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no labelled arrays")


def provenance_of(data: dict) -> dict:
    """The stamps of a file's content, or this code's for a new result."""
    found = {k: data[k] for k in PROVENANCE if k in data}
    return found or stamps()


class Record(Result):
    """A result whose solver returns a plain record (a dict of the file's fields)."""

    def __init__(self, record: dict) -> None:
        self.provenance = provenance_of(record)
        self.record = {k: v for k, v in record.items() if k not in PROVENANCE}

    @property
    def params(self) -> dict:  # type: ignore[override]
        """Every input of the computation."""
        return self.record.get("params", {})

    def to_dict(self) -> dict:
        return dict(self.record)

    @classmethod
    def from_dict(cls, data: dict) -> Record:
        return cls(data)

    def summary(self) -> str:
        return f"{type(self).__name__}({', '.join(sorted(self.record))})"


def xarray_module() -> Any:
    """xarray, an optional dependency, with an install hint when it is missing."""
    try:
        import xarray
    except ImportError:
        raise ValidationError("to_xarray: needs xarray (pip install xarray)") from None
    return xarray


def engine_text(params: dict) -> str:
    engine = params.get("engine")
    if isinstance(engine, dict):
        return str(engine.get("engine", "?"))
    return str(engine) if engine is not None else "?"


def setting_text(params: dict) -> str:
    act = params.get("activation", {})
    name = act.get("name", act) if isinstance(act, dict) else act
    task = params.get("task", {})
    return f"{name}, L={task.get('L')}, {task.get('prior', '?')} nu={task.get('nu')}"


class OverlapPlots:
    """The Fig. 1 panels of a result holding t, M, Q, error over time (ODE or simulation)."""

    runs_axis: ClassVar[bool] = False
    default_label: ClassVar[str] = ""

    def plot(self, other: Result | None = None, ax: Any = None,
             label: str | None = None) -> Any:
        """The four panels of the paper's Fig. 1 (E, m along f = 1, f = 2, orthogonal part)
        and one legend right of them naming every series drawn on these axes.

        Parameters
        ----------
        other : Result, optional
            A second result drawn on the same axes: ``ode.plot(sim)`` draws the ODE as
            lines and the simulation's runs as a 10–90 % band around their median (or as
            every run's trace where the runs break a symmetry in different ways).
        ax : sequence of Axes, optional
            3–4 axes to draw on (default: a new figure).  Plotting a second result on the
            same axes adds it to the legend: give each a ``label``.
        label : str, optional
            This result's name in the legend (default ``ODE`` or ``SGD``), e.g. the
            activation when two trajectories share the axes.

        Returns
        -------
        Figure
            The figure the axes are on.
        """
        from ..figures.series import series_legend, series_legend_right
        from ..figures.style import new_figure
        fig: Any                                 # a Figure (or the SubFigure ``ax`` is on)
        new = ax is None
        if new:
            fig, axes = new_figure(1, len(self.panel_names()), panel_size=(3.3, 2.6))
        else:
            axes = list(np.atleast_1d(ax))
            fig = axes[0].figure
        axes = axes[:len(self.panel_names())]
        self.draw_panels(axes, label or self.default_label)
        if isinstance(other, OverlapPlots):
            other.draw_panels(axes, other.default_label)
        elif other is not None:
            other.plot(ax=axes)
        # one legend naming every result drawn on these axes so far: under a figure of our
        # own, right of the caller's axes (a second plot there replaces it with one naming
        # both, and the caller's tight_layout keeps it in view)
        if new:
            series_legend(fig, axes, self.heads())
        else:
            series_legend_right(axes[-1], axes)
        return fig

    def panel_names(self) -> list[str]:
        """The panels this result has (no m along f = 2 with a single direction)."""
        from ..figures.compare import PANELS
        return [p for p in PANELS if p != "m_f2" or self.M.shape[-1] >= 2]  # type: ignore[attr-defined]

    def heads(self) -> int:
        """The number of heads H (the legend's columns hold H + 1 entries: heads and E)."""
        return int(self.M.shape[-2])  # type: ignore[attr-defined]

    def draw_panels(self, axes: list[Any], prefix: str) -> None:
        """Draw this result's series on the panels' axes, named ``prefix`` in the legend."""
        from ..figures.compare import PANEL_LABELS, panel_series
        series = panel_series(self.to_dict(), self.runs_axis)  # type: ignore[attr-defined]
        for axis, name in zip(axes, self.panel_names()):
            self.draw_series(axis, series[name], prefix)
            axis.set_xlabel(r"$t$ = steps / $D$")
            axis.set_ylabel(PANEL_LABELS[name])

    def draw_series(self, axis: Any, values: np.ndarray, prefix: str) -> None:
        """Draw one panel's values (times × series, runs first for a simulation), named
        ``prefix`` in the legend."""
        raise NotImplementedError


class Derivation(Record):
    """The text of the derivation (Markdown, LaTeX) or of the generated source."""

    kind = "derivation"

    @property
    def text(self) -> str:
        return str(self.record["text"])

    def summary(self) -> str:
        return (f"Derivation({self.record.get('format')}, "
                f"{len(self.text.splitlines())} lines)")

    def _repr_markdown_(self) -> str | None:
        return self.text if self.record.get("format") == "markdown" else None


class Drift(Record):
    """The ODE right-hand side at one state: dM (H, F), dQ (H, H), da, db (H,), the error E
    at the state, each with its error estimate (``errors``) and the largest (``abs_err``)."""

    kind = "drift"

    @property
    def dM(self) -> np.ndarray:
        return np.asarray(self.record["dM"], dtype=float)

    @property
    def dQ(self) -> np.ndarray:
        return np.asarray(self.record["dQ"], dtype=float)

    @property
    def da(self) -> np.ndarray:
        return np.asarray(self.record["da"], dtype=float)

    @property
    def db(self) -> np.ndarray:
        return np.asarray(self.record["db"], dtype=float)

    @property
    def abs_err(self) -> float:
        err = self.record.get("abs_err")
        return float("inf") if err is None else float(err)

    def summary(self) -> str:
        d = self.record
        return (f"Drift(engine={engine_text(d)}, |dM|={np.abs(self.dM).max():.3g}, "
                f"|dQ|={np.abs(self.dQ).max():.3g}, E={d.get('error')}, "
                f"abs_err={d.get('abs_err')})")


class Escape(Record):
    """The predicted law of the specialisation time τ_f at finite D (docs/theory.md §8):
    ``prediction`` (per D: mean, std, quantiles of τ and the closed forms) and the
    ``linearisation`` it rests on."""

    kind = "escape"

    @property
    def per_D(self) -> list[dict]:
        return list(self.record["prediction"]["per_D"])

    def summary(self) -> str:
        rows = ", ".join(f"D={r['D']}: <tau>={r['tau']['mean']:.4g}" for r in self.per_D)
        return f"Escape(tau_{self.record['prediction']['direction']}; {rows})"


class Comparison(Record):
    """A user's training log against the ODE and the finite-D spread: the ``verdict`` of a
    test with stated false-alarm ``rate``, its ``p_value``, the ``worst`` (time, component),
    the largest deviation in units of the spread (``max_abs_z``) and the series behind them.

    >>> c = Comparison({"verdict": "consistent", "p_value": 0.4, "rate": 0.01,
    ...                 "max_abs_z": 2.5, "worst": {"quantity": "M[0,1]", "t_max_z": 1.0}})
    >>> c.p_value, c.rate, c.worst["quantity"]
    (0.4, 0.01, 'M[0,1]')
    """

    kind = "compare"

    @property
    def verdict(self) -> str:
        return str(self.record["verdict"])

    @property
    def p_value(self) -> float:
        """The share of simulated runs at least as far from the theory (calibrated)."""
        return float(self.record["p_value"])

    @property
    def rate(self) -> float:
        """The stated false-alarm rate: inconsistent when ``p_value`` ≤ ``rate``."""
        return float(self.record["rate"])

    @property
    def worst(self) -> dict:
        """The judged quantity with the largest |z|, its time and size."""
        return dict(self.record["worst"])

    def summary(self) -> str:
        d = self.record
        return (f"Comparison(verdict={d.get('verdict')!r}, p={d.get('p_value')}, "
                f"rate={d.get('rate')}, max|z|={d.get('max_abs_z')})")


class FigureResult(Record):
    """A reproduced figure: its plotted data (the figN.json content) and the files written."""

    kind = "figure"

    @property
    def files(self) -> list[str]:
        return [str(f) for f in self.record.get("files", [])]

    def summary(self) -> str:
        return f"FigureResult(figure {self.record.get('figure')}, files={self.files})"


class GalleryResult(Record):
    """Every figure made by one ``figure all`` run: the figures' results, what each cost, and
    the totals (the ``gallery.json`` summary file, ``gallery_quick.json`` for a quick run).

    The summary names each figure's files relative to its own folder; :attr:`figures` reads
    them from there (``folder``: where the summary is, set by :func:`load`).

    Examples
    --------
    >>> g = GalleryResult({"gallery": {"quick": True, "figures": [8], "jobs": 1,
    ...                                "cpu_seconds": 9.0, "wall_seconds": 6.0},
    ...                    "entries": [{"figure": 8, "json": "fig8_quick.json",
    ...                                 "png": "fig8_quick.png", "kept": False,
    ...                                 "timing": {"cpu_seconds": 9.0, "wall_seconds": 6.0,
    ...                                            "jobs": 1}}]})
    >>> g.numbers
    [8]
    >>> print(g.table())
    figure   CPU s   wall s  jobs
         8     9.0      6.0     1
     total     9.0      6.0
    """

    kind = "gallery"

    def __init__(self, record: dict, folder: str | Path | None = None,
                 figures: list[FigureResult] | None = None) -> None:
        super().__init__(record)
        self.folder = Path(folder) if folder is not None else None
        self._figures = figures

    @property
    def numbers(self) -> list[int]:
        """The figures of this run, in order."""
        return [int(e["figure"]) for e in self.entries]

    @property
    def entries(self) -> list[dict]:
        """One record per figure: its files (``json``, ``png``), whether it was ``kept`` from
        an earlier run, and its ``timing`` (see ``figures.runner.timing_record``)."""
        return list(self.record.get("entries", []))

    @property
    def figures(self) -> list[FigureResult]:
        """The result of every figure (read from the files beside the summary when this
        result was loaded from it)."""
        if self._figures is None:
            if self.folder is None:
                raise ValidationError("figures: this gallery result does not know its folder; "
                                      "load it with tk.load(path)")
            self._figures = [figure_file(self.folder / e["json"],
                                         [self.folder / e["png"], self.folder / e["json"]])
                             for e in self.entries]
        return list(self._figures)

    @property
    def files(self) -> list[str]:
        """Every file of the run: each figure's PNG and JSON, then the summary (when saved)."""
        base = self.folder if self.folder is not None else Path()
        names = [str(base / e[k]) for e in self.entries for k in ("png", "json")]
        return names + ([self.summary_file] if self.summary_file else [])

    @property
    def summary_file(self) -> str | None:
        """The summary file (``gallery.json``, ``gallery_quick.json``), or None when this
        result was not saved as one (a redraw)."""
        name = self.record.get("summary")
        if not name:
            return None
        return str((self.folder if self.folder is not None else Path()) / name)

    def table(self) -> str:
        """Each figure's CPU and wall seconds with the jobs it ran on, and the total."""
        lines = [f"{'figure':>6} {'CPU s':>7} {'wall s':>8} {'jobs':>5}"]
        for e in self.entries:
            t = e.get("timing") or {}
            kept = "  (kept: made before)" if e.get("kept") else ""
            lines.append(f"{e['figure']:>6} {_seconds(t.get('cpu_seconds')):>7} "
                         f"{_seconds(t.get('wall_seconds')):>8} {t.get('jobs', '?'):>5}{kept}")
        total = self.record.get("gallery", {})
        lines.append(f"{'total':>6} {_seconds(total.get('cpu_seconds')):>7} "
                     f"{_seconds(total.get('wall_seconds')):>8}")
        return "\n".join(lines)

    def summary(self) -> str:
        g = self.record.get("gallery", {})
        kept = sum(bool(e.get("kept")) for e in self.entries)
        return (f"GalleryResult({len(self.entries)} figures{' (quick)' if g.get('quick') else ''}"
                f", {kept} kept, {_seconds(g.get('wall_seconds'))} s wall, "
                f"{_seconds(g.get('cpu_seconds'))} CPU s)")


def _seconds(value: object) -> str:
    """Seconds as a short number, or ? when unknown."""
    return f"{float(value):.1f}" if isinstance(value, (int, float)) else "?"


def figure_file(js: Path, files: Sequence[Path] = ()) -> FigureResult:
    """A figure's JSON file as its result, naming ``files`` as the files written (default:
    the JSON file).

    >>> import tempfile, pathlib
    >>> from theory_kit.io.results import write_json
    >>> js = write_json(pathlib.Path(tempfile.mkdtemp()) / "fig8.json", {"figure": 8, "data": {}})
    >>> result = figure_file(js)
    >>> result.record["figure"], result.files == [str(js)]
    (8, True)
    """
    data = restore_non_finite(read_json(js, "path"))
    data.pop("request", None)
    return FigureResult({**data, "files": [str(f) for f in (files or [js])]})


def kind_of(data: dict) -> type[Result]:
    """The result type of a file's content, from the fields it holds.

    >>> kind_of({"t": [0, 1], "M": [[[0.0]], [[1.0]]]}).__name__
    'Trajectory'
    >>> kind_of({"t": [0], "M": [[[[0.0]]]]}).__name__
    'Simulation'
    """
    from ..asymptotic.runs import EinfResult
    from ..dynamics.ode import Trajectory
    from ..dynamics.simulation import Simulation
    from ..expect.error import ErrorValue
    if "dM" in data and "dQ" in data:
        return Drift
    if "gallery" in data and "entries" in data:
        return GalleryResult
    if "einf" in data and "runs" in data:
        return EinfResult
    if "verdict" in data:
        return Comparison
    if "t" in data and "M" in data:
        return Simulation if np.ndim(data["M"]) == 4 else Trajectory
    if "error" in data and "abs_err" in data and "method" in data:
        return ErrorValue
    if "text" in data and "format" in data:
        return Derivation
    if "prediction" in data and "linearisation" in data:
        return Escape
    if "figure" in data:
        return FigureResult
    raise ValidationError("path: the file is not a result of this toolkit (none of its "
                          f"fields identify one: {', '.join(sorted(data))[:200]})")


def load(path: str | Path) -> Result:
    """Read any result file of the toolkit (API or CLI) back into its result type.

    Parameters
    ----------
    path : str or Path
        A JSON file written by ``Result.save`` or by a ``theory-kit`` verb.

    Returns
    -------
    Result
        The verb's result type (``Trajectory``, ``Simulation``, ``EinfResult``, ...).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from theory_kit.io.result import Drift, load
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "d.json"
    >>> _ = Drift({"dM": [[0.0]], "dQ": [[0.0]], "da": [0.0], "db": [0.0]}).save(path)
    >>> type(load(path)).__name__
    'Drift'
    """
    data = restore_non_finite(read_json(path, "path"))
    data.pop("request", None)
    result = kind_of(data).from_dict(data)
    if isinstance(result, GalleryResult):   # its figures' files are beside it
        result.folder = Path(path).parent
    return result
