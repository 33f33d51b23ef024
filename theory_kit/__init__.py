"""theory_kit: the theory of multi-head attention in the single-location model.

Data flows one way, and the subpackages follow it: ``model`` (task, priors, state,
activations) → ``symbolic`` (SymPy derivation) → ``kernels`` (generated, compiled callables)
→ ``expect`` (Monte Carlo, quadrature, mpmath, Laplace) → ``dynamics`` (ODE, simulation,
escape) and ``asymptotic`` (E∞) → ``analysis`` → ``figures``.  ``userdata`` reads a user's
training logs, ``io`` writes result files and runs sweeps.  The equations are in
docs/theory.md.

The Python API (:mod:`theory_kit.api`) has one function per ``theory-kit`` verb, with the same
parameter names and defaults::

    import theory_kit as tk
    tr = tk.ode(activation="softmax", H=2, L=4, nu=[2, 2], gamma=1, T=30, D=10_000)
    sim = tk.simulate(activation="softmax", H=2, L=4, nu=[2, 2], D=10_000, runs=10, T=30)
    tr.plot(sim)            # ODE lines, SGD dots
    tr.save("run.json"); tk.load("run.json")

The names are imported on first use (PEP 562), so ``import theory_kit`` loads neither SymPy,
SciPy, numba nor matplotlib.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .api.lazy import lazy_attributes

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    **{name: "theory_kit.api" for name in (
        "activation", "task", "error", "bayes_error", "derive", "drift", "ode", "simulate",
        "einf", "escape", "compare", "figure", "load")},   # (theory_kit.api.VERBS)
    **{name: "theory_kit.options" for name in (
        "Engine", "Integrator", "Rates", "Run", "Limits", "Stop", "Solver", "Evaluation")},
    "Task": "theory_kit.model.task",
    "ValidationError": "theory_kit.model.validation",
    **{name: "theory_kit.io.result" for name in (
        "Comparison", "Derivation", "Drift", "Escape", "FigureResult", "GalleryResult",
        "Result")},
    "ErrorValue": "theory_kit.expect.error",
    "Trajectory": "theory_kit.dynamics.trajectory",
    "Simulation": "theory_kit.dynamics.simulation",
    "EinfResult": "theory_kit.asymptotic.runs",
    "OverlapLog": "theory_kit.userdata.overlap_log",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names, seen by type checkers and editors (``X as X``: re-exported)
    from .api import activation as activation
    from .api import bayes_error as bayes_error
    from .api import compare as compare
    from .api import derive as derive
    from .api import drift as drift
    from .api import einf as einf
    from .api import error as error
    from .api import escape as escape
    from .api import figure as figure
    from .api import load as load
    from .api import ode as ode
    from .api import simulate as simulate
    from .api import task as task
    from .asymptotic.runs import EinfResult as EinfResult
    from .dynamics.simulation import Simulation as Simulation
    from .dynamics.trajectory import Trajectory as Trajectory
    from .expect.error import ErrorValue as ErrorValue
    from .io.result import Comparison as Comparison
    from .io.result import Derivation as Derivation
    from .io.result import Drift as Drift
    from .io.result import Escape as Escape
    from .io.result import FigureResult as FigureResult
    from .io.result import GalleryResult as GalleryResult
    from .io.result import Result as Result
    from .model.task import Task as Task
    from .model.validation import ValidationError as ValidationError
    from .options import Engine as Engine
    from .options import Evaluation as Evaluation
    from .options import Integrator as Integrator
    from .options import Limits as Limits
    from .options import Rates as Rates
    from .options import Run as Run
    from .options import Solver as Solver
    from .options import Stop as Stop
    from .userdata.overlap_log import OverlapLog as OverlapLog


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals())
