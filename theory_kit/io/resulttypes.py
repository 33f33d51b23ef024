"""Result objects of the Python API (:mod:`theory_kit.api`): one small base for every verb.

Each result wraps the data of the file the matching CLI verb writes, so a result and the file
are the same thing: ``.save(path)`` writes that strict JSON, and :func:`load` reads any result
file (written by the API or by the CLI) back into the right type. Every result

* prints as a short summary (the setting, the engine, the sizes, the key numbers and their
  error estimates);
* keeps every input, the engine and the toolkit version in ``.params`` / ``.version``;
* draws its standard panels with ``.plot()`` (``ode.plot(sim)`` overlays another result;
  ``ax=`` draws on given axes);
* exports labelled arrays with ``.to_xarray()`` (dims ``t``, ``run``, ``head``, ``head2``,
  ``feature``; xarray is an optional dependency).

Arrays are NumPy; their shapes are in each property's docstring. The maths is in docs/theory.md.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..model.validation import ValidationError


class Result:
    """Base of every result: the verb's data dict, with provenance, saving and summary."""

    kind: ClassVar[str] = "result"

    def __init__(self, data: dict) -> None:
        self.data = data

    @property
    def params(self) -> dict:
        """Every input of the computation, as the CLI records it."""
        return self.data.get("params", {})

    @property
    def version(self) -> str | None:
        """The toolkit version that computed the result."""
        return self.data.get("version")

    @property
    def code_digest(self) -> str | None:
        """SHA-256 of the toolkit's source that computed the result (``results.CODE_DIGEST``;
        the version number alone does not change with every code change)."""
        return self.data.get("code_digest")

    def array(self, key: str) -> np.ndarray:
        return np.asarray(self.data[key], dtype=float)

    def summary(self) -> str:
        return f"{type(self).__name__}({', '.join(sorted(self.data))})"

    def __repr__(self) -> str:
        return self.summary()

    def save(self, path: str | Path) -> Path:
        """Write the result as the CLI writes it (strict JSON, atomically); returns the path."""
        from .results import write_json
        return write_json(path, self.data)

    def plot(self, other: "Result | None" = None, ax: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no standard plot")

    def to_xarray(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no labelled arrays")


def _xarray() -> Any:
    try:
        import xarray
    except ImportError:
        raise ValidationError("to_xarray: needs xarray (pip install xarray)") from None
    return xarray


def _engine_text(params: dict) -> str:
    engine = params.get("engine")
    if isinstance(engine, dict):
        return engine.get("engine", "?")
    return str(engine) if engine is not None else "?"


def _setting_text(params: dict) -> str:
    act = params.get("activation", {})
    name = act.get("name", act) if isinstance(act, dict) else act
    task = params.get("task", {})
    nu = task.get("nu")
    return f"{name}, L={task.get('L')}, {task.get('prior', '?')} nu={nu}"


class ErrorValue(Result):
    """E or E_Bayes: ``value`` ± ``abs_err`` (an honest numerical error), and the ``method``.

    >>> ErrorValue({"error": 0.5, "abs_err": 1e-9, "method": "quad"})
    ErrorValue(0.5 +/- 1e-09, method=quad)
    """

    kind = "error"

    @property
    def value(self) -> float:
        return float(self.data["error"])

    @property
    def abs_err(self) -> float:
        return float(self.data["abs_err"])

    @property
    def method(self) -> str:
        return str(self.data["method"])

    def summary(self) -> str:
        return f"ErrorValue({self.value:.12g} +/- {self.abs_err:.2g}, method={self.method})"


class Derivation(Result):
    """The text of ``theory-kit derive`` (Markdown, LaTeX or the generated source)."""

    kind = "derivation"

    @property
    def text(self) -> str:
        return self.data["text"]

    def summary(self) -> str:
        return f"Derivation({self.data.get('format')}, {len(self.text.splitlines())} lines)"

    def _repr_markdown_(self) -> str | None:
        return self.text if self.data.get("format") == "markdown" else None


class _Overlaps(Result):
    """Shared by trajectories and simulations: t, M, Q, a, b, error, and the Fig. 1 panels."""

    runs_axis: ClassVar[bool] = False

    @property
    def t(self) -> np.ndarray:
        """Recorded times, shape (times,)."""
        return self.array("t")

    @property
    def M(self) -> np.ndarray:
        return self.array("M")

    @property
    def Q(self) -> np.ndarray:
        return self.array("Q")

    @property
    def a(self) -> np.ndarray:
        return self.array("a")

    @property
    def b(self) -> np.ndarray:
        return self.array("b")

    @property
    def error(self) -> np.ndarray:
        return self.array("error")

    def plot(self, other: "Result | None" = None, ax: Any = None) -> Any:
        """The four panels of the paper's Fig. 1 (E, m along f = 1, f = 2, orthogonal part).

        ``other``: a second result drawn on the same axes (an ODE as lines, a simulation as
        mean ± std dots): ``ode.plot(sim)``. ``ax``: 3–4 axes to draw on (default: a new
        figure)."""
        from ..figures.compare import PANEL_LABELS, PANELS, panel_series
        from ..figures.style import label_axes, new_figure, series_colors
        series = panel_series(self.data, self.runs_axis)
        names = [p for p in PANELS if p in series]
        if ax is None:
            fig, axes = new_figure(1, len(names))
        else:
            axes = list(np.atleast_1d(ax))
            fig = axes[0].figure
        for axis, name in zip(axes, names):
            values = series[name]
            colors = series_colors(values.shape[-1])
            for j in range(values.shape[-1]):
                self._draw(axis, values[..., j], colors[j], name == "error" or j == 0)
            label_axes(axis, "t", PANEL_LABELS[name])
        if other is not None:
            other.plot(ax=axes)
        return fig

    def _draw(self, axis: Any, values: np.ndarray, color: Any, label: bool) -> None:
        raise NotImplementedError


class Trajectory(_Overlaps):
    """An ODE solution: t (times,), M (times, H, F), Q (times, H, H), a, b (times, H),
    error (times,) and error_stderr (times,)."""

    kind = "ode"

    def summary(self) -> str:
        p = self.params
        M = self.M
        return (f"Trajectory({_setting_text(p)}; H={M.shape[1]}, gamma={p.get('gamma')}, "
                f"engine={_engine_text(p)}; {len(self.t)} times up to t={self.t[-1]:g}; "
                f"E(T)={self.error[-1]:.6g})")

    def _draw(self, axis: Any, values: np.ndarray, color: Any, label: bool) -> None:
        axis.plot(self.t, values, color=color, label="ODE" if label else None)

    def to_xarray(self) -> Any:
        xr = _xarray()
        dims = ("t", "head")
        return xr.Dataset({"M": (("t", "head", "feature"), self.M),
                           "Q": (("t", "head", "head2"), self.Q),
                           "a": (dims, self.a), "b": (dims, self.b), "error": (("t",), self.error)},
                          coords={"t": self.t}, attrs={"params": json.dumps(self.params)})


class Simulation(_Overlaps):
    """Finite-D SGD runs: t (times,), M (runs, times, H, F), Q (runs, times, H, H),
    a, b (runs, times, H), error and error_running (runs, times)."""

    kind = "simulate"
    runs_axis = True

    def summary(self) -> str:
        p = self.params
        M = self.M
        return (f"Simulation({p.get('method')} SGD, D={p.get('D')}, {M.shape[0]} runs, H={M.shape[2]}, "
                f"gamma={p.get('gamma')}; {len(self.t)} times up to t={self.t[-1]:g}; "
                f"E(T)={self.error[:, -1].mean():.4g} +/- {self.error[:, -1].std():.2g} over runs)")

    def _draw(self, axis: Any, values: np.ndarray, color: Any, label: bool) -> None:
        spread = values.std(axis=0, ddof=1) if values.shape[0] > 1 else None
        axis.errorbar(self.t, values.mean(axis=0), yerr=spread, fmt="o", ms=3, color=color,
                      capsize=2, label="SGD" if label else None)

    def to_xarray(self) -> Any:
        xr = _xarray()
        dims = ("run", "t", "head")
        return xr.Dataset({"M": (dims + ("feature",), self.M), "Q": (dims + ("head2",), self.Q),
                           "a": (dims, self.a), "b": (dims, self.b),
                           "error": (("run", "t"), self.error)},
                          coords={"t": self.t}, attrs={"params": json.dumps(self.params)})


class EinfResult(Result):
    """E∞: per run, per group of fixed points, the mean, the global minimum and E_Bayes."""

    kind = "einf"

    @property
    def value(self) -> float:
        return float(self.data["einf"])

    @property
    def abs_err(self) -> float:
        """The error bar of the mean E∞; inf when a run is not certified (JSON null, the
        reason in ``abs_err_reason``)."""
        err = self.data["abs_err"]
        return float("inf") if err is None else float(err)

    @property
    def abs_err_reason(self) -> str | None:
        return self.data.get("abs_err_reason")

    @property
    def runs(self) -> list[dict]:
        return self.data["runs"]

    def summary(self) -> str:
        d = self.data
        bayes = d.get("bayes")
        floor = f", E_Bayes={bayes:.6g}" if bayes is not None else ""
        bar = (f"+/- {self.abs_err:.2g}" if np.isfinite(self.abs_err)
               else "+/- unknown (not converged)")
        return (f"EinfResult({_setting_text(self.params)}; {len(self.runs)} runs, "
                f"{len(d.get('groups', []))} group(s); E_inf={self.value:.6g} {bar}{floor})")

    def plot(self, other: "Result | None" = None, ax: Any = None) -> Any:
        """E∞ of each run (dots), the mean, and the Bayes floor (dashed)."""
        from ..figures.style import label_axes, new_figure
        fig, axes = new_figure(1, 1) if ax is None else (ax.figure, [ax])
        values = [r["einf"] for r in self.runs]
        axes[0].plot(range(len(values)), values, "o", label="runs")
        if self.data.get("bayes") is not None:
            axes[0].axhline(self.data["bayes"], ls="--", color="k", label="E_Bayes")
        label_axes(axes[0], "run", r"$E_\infty$")
        return fig


class Drift(Result):
    """The ODE right-hand side at one state: dM (H, F), dQ (H, H), da, db (H,), E, abs_err."""

    kind = "drift"

    @property
    def dM(self) -> np.ndarray:
        return self.array("dM")

    @property
    def dQ(self) -> np.ndarray:
        return self.array("dQ")

    def summary(self) -> str:
        d = self.data
        return (f"Drift(engine={_engine_text(d)}, |dM|={np.abs(self.dM).max():.3g}, "
                f"|dQ|={np.abs(self.dQ).max():.3g}, E={d.get('error')}, abs_err={d.get('abs_err')})")


class Escape(Result):
    """Predicted law of the specialisation time at finite D (``theory-kit escape``)."""

    kind = "escape"


class Comparison(Result):
    """A user's training log against the ODE and the finite-D spread (``theory-kit compare``)."""

    kind = "compare"

    def summary(self) -> str:
        d = self.data
        return f"Comparison(verdict={d.get('verdict')!r}, max|z|={d.get('max_abs_z', d.get('max_z'))})"


class FigureResult(Result):
    """A reproduced figure: its plotted data (the figN.json content) and the files written."""

    kind = "figure"

    def summary(self) -> str:
        return f"FigureResult(files={self.data.get('files')})"


def kind_of(data: dict) -> type[Result]:
    """The result type of a file's content, from the fields it holds.

    >>> kind_of({"t": [0, 1], "M": [[[0.0]], [[1.0]]]}).__name__
    'Trajectory'
    >>> kind_of({"t": [0], "M": [[[[0.0]]]]}).__name__
    'Simulation'
    """
    if "dM" in data and "dQ" in data:
        return Drift
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
    if "lambda" in data or "escape" in str(data.get("kind", "")):
        return Escape
    return FigureResult if "figure" in data or "files" in data else Result


def load(path: str | Path) -> Result:
    """Read any result file of the toolkit (API or CLI) back into its result type.

    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"path: must be a readable JSON result file ({exc})") from None
    if not isinstance(data, dict):
        raise ValidationError(f"path: {path} does not hold a result object")
    return kind_of(data)(data)
