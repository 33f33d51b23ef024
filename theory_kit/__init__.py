"""theory_kit: the theory of multi-head attention in the single-location model.

Data flows one way: model → activations → derive (SymPy) → codegen (compiled callables) →
expect (Monte Carlo, quadrature, mpmath) → error / ode / einf / simulate → analysis → figures.
The equations are in docs/theory.md.

The flat Python API (:mod:`theory_kit.api`) mirrors the ``theory-kit`` verbs, with the same
parameter names and defaults::

    import theory_kit as tk
    tr = tk.ode(activation="softmax", H=2, L=4, nu=[2, 2], gamma=1, T=30, D=10_000)
    sim = tk.simulate(activation="softmax", H=2, L=4, nu=[2, 2], D=10_000, runs=10, T=30)
    tr.plot(sim)            # ODE lines, SGD dots
    tr.save("run.json"); tk.load("run.json")
"""
import importlib
import sys
import types

__version__ = "0.1.0"

# Verbs whose name is also a module of the package (theory_kit.ode is the ODE integrator,
# tk.ode(...) the API call). Python binds a submodule as the package attribute of the same
# name, so the module object itself is made callable: tk.ode(...) runs api.ode(...), while
# `from theory_kit.ode import integrate_ode` keeps working.
_VERB_MODULES = ("derive", "error", "ode", "simulate", "einf", "escape")


class _VerbModule(types.ModuleType):
    """A module that is also the API function of the same name (see ``_VERB_MODULES``)."""

    def __call__(self, *args, **kwargs):
        return getattr(api, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


for _name in _VERB_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:   # a verb whose module is not part of this build
        if _exc.name != f"{__name__}.{_name}":
            raise
        continue
    sys.modules[f"{__name__}.{_name}"].__class__ = _VerbModule

from . import api  # noqa: E402

for _name in _VERB_MODULES:
    if f"{__name__}.{_name}" not in sys.modules:
        globals()[_name] = getattr(api, _name)
from .api import (activation, bayes_error, command_line, compare, drift, figure,  # noqa: E402
                  load, task)
from .model import Task  # noqa: E402
from .resulttypes import (Comparison, Derivation, Drift, EinfResult, ErrorValue,  # noqa: E402
                          Escape, FigureResult, Result, Simulation, Trajectory)

__all__ = ["__version__", "Task", "task", "activation", "error", "bayes_error", "derive",
           "drift", "ode", "simulate", "einf", "escape", "compare", "figure", "load",
           "command_line", "Result", "ErrorValue", "Derivation", "Trajectory", "Simulation",
           "EinfResult", "Drift", "Escape", "Comparison", "FigureResult"]
