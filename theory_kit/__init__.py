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

The names are imported on first use (PEP 562): ``import theory_kit`` loads neither SymPy,
SciPy, numba nor matplotlib, so a ``theory-kit`` process (and every process a sweep or a test
starts) pays only for the modules its verb needs.
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
# name -> the submodule that defines it (the rest of the public API)
_LAZY = {**{name: "api" for name in ("activation", "bayes_error", "command_line", "compare",
                                     "drift", "figure", "load", "task")},
         "Task": "model",
         **{name: "resulttypes" for name in ("Comparison", "Derivation", "Drift", "EinfResult",
                                             "ErrorValue", "Escape", "FigureResult", "Result",
                                             "Simulation", "Trajectory")}}

__all__ = ["__version__", "Task", "task", "activation", "error", "bayes_error", "derive",
           "drift", "ode", "simulate", "einf", "escape", "compare", "figure", "load",
           "command_line", "Result", "ErrorValue", "Derivation", "Trajectory", "Simulation",
           "EinfResult", "Drift", "Escape", "Comparison", "FigureResult"]


class _VerbModule(types.ModuleType):
    """A module that is also the API function of the same name (see ``_VERB_MODULES``)."""

    def __call__(self, *args, **kwargs):
        from . import api
        return getattr(api, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


class _Package(types.ModuleType):
    """The package module: a verb submodule becomes callable when the import system binds it
    here, however it was imported (``import theory_kit.ode``, ``from theory_kit.ode import
    ...``, or ``tk.ode``, which imports it on first use)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _VERB_MODULES and type(value) is types.ModuleType:
            value.__class__ = _VerbModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> object:
    """The public names, imported on first use (a verb: its module, made callable)."""
    if name in _VERB_MODULES:
        try:
            return importlib.import_module(f"{__name__}.{name}")   # binds it (see _Package)
        except ModuleNotFoundError as exc:   # a verb whose module is not part of this build
            if exc.name != f"{__name__}.{name}":
                raise
            value = getattr(importlib.import_module(f"{__name__}.api"), name)
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
