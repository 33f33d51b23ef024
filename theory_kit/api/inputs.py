"""The inputs of the API verbs, checked and turned into the model's objects.

Every verb accepts plain Python or NumPy values (lists or arrays for ν, M, Q, ...), an
activation as a preset name or an :class:`~theory_kit.model.activations.Activation`, and its
option objects (:mod:`theory_kit.options`).  Bad input raises
:class:`~theory_kit.model.validation.ValidationError` naming the parameter and the allowed
range, with the command line's message.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import numpy.typing as npt

from ..io import limits, progress
from ..model.activations import PRESETS, Activation, get_activation
from ..model.priors import make_prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import (
    OutputError,
    ValidationError,
    as_finite_array,
    check_flag,
    check_int,
    check_number,
    check_power_of_two,
    fail,
)
from ..options import Engine, Integrator, Rates, Run

ActivationLike = Union[str, Activation]
ArrayLike = npt.ArrayLike
EngineLike = Union[str, Engine]
# rates and scales beyond this overflow float64 when squared (γ², η²) deep inside a run
MAX_SCALE = 1e100


def as_activation(value: object) -> Activation:
    """A preset name or an Activation (from :func:`theory_kit.api.activation`)."""
    if isinstance(value, Activation):
        return value
    if isinstance(value, str):
        return get_activation(value)
    raise ValidationError(f"activation: must be a preset name ({', '.join(PRESETS)}) or an "
                          f"Activation from tk.activation (got {type(value).__name__})")


def as_task(L: int, prior: str, nu: ArrayLike, delta: float) -> Task:
    """The task of docs/theory.md §1 with a flipping or Gaussian prior of strengths ν."""
    if prior not in ("flipping", "gaussian"):
        raise ValidationError(f"prior: must be one of flipping, gaussian (got {prior!r}); "
                              "other priors through tk.task / theory_kit.model.priors")
    return Task(L, make_prior(prior, nu=as_finite_array(nu, "nu", ndim=1)), delta)


def optional_array(value: ArrayLike | None, param: str, ndim: int) -> np.ndarray | None:
    """None, or a finite float array of rank ``ndim``."""
    return None if value is None else as_finite_array(value, param, ndim=ndim)


def as_state(act: Activation, task: Task, M: ArrayLike, Q: ArrayLike, a: ArrayLike | None,
             b: ArrayLike | None) -> State:
    """The state (M, Q, a, b); a and b default to the activation's presets."""
    M_arr = as_finite_array(M, "M", ndim=2)
    Q_arr = as_finite_array(Q, "Q", ndim=2)
    H = M_arr.shape[0]
    if H < 1:
        raise ValidationError("H: must be an integer >= 1 (M has no rows)")
    a_arr = optional_array(a, "a", 1)
    b_arr = optional_array(b, "b", 1)
    return State(M_arr, Q_arr, act.a_default(H, task.L) if a_arr is None else a_arr,
                 act.b_default(H, task.L) if b_arr is None else b_arr)


def as_engine(engine: EngineLike, names: tuple[str, ...] | None = None) -> Engine:
    """An engine name, or the Engine options themselves, every field checked (the command
    line's names: ``samples``, ``mc-seed``); ``names``: the engines the verb takes (default
    every engine of ``expect.engines``)."""
    if isinstance(engine, str):
        engine = Engine(engine)
    if not isinstance(engine, Engine):
        raise ValidationError(f"engine: must be an engine name or a theory_kit.options.Engine "
                              f"(got {type(engine).__name__})")
    if names is None:
        from ..expect.engines import ENGINE_NAMES  # (here: tk.error needs no engine)
        names = ENGINE_NAMES
    if not isinstance(engine.name, str) or engine.name not in names:
        fail("engine", f"must be one of {', '.join(names)}", engine.name)
    check_int(engine.samples, "samples", 2)
    check_int(engine.seed, "mc-seed", 0)
    check_flag(engine.fresh, "fresh")
    check_flag(engine.symmetric_heads, "symmetric_heads")
    check_number(engine.tol, "tol", above=0.0, maximum=1.0)
    check_power_of_two(engine.budget, "budget", 4)
    return engine


def check_rates(rates: Rates) -> Rates:
    """Training switches (None or True/False) and rates (None or a finite number > 0, at
    most :data:`MAX_SCALE`) of the head scalars."""
    check_options(rates=(rates, Rates))
    for name in ("train_a", "train_b"):
        if getattr(rates, name) is not None:
            check_flag(getattr(rates, name), name)
    for name in ("gamma_a", "gamma_b"):
        if getattr(rates, name) is not None:
            check_number(getattr(rates, name), name, above=0.0, maximum=MAX_SCALE)
    return rates


def check_integrator(integrator: Integrator) -> Integrator:
    """The ODE integrator: a method of ``dynamics.ode.METHODS`` and finite step and
    tolerances > 0."""
    check_options(integrator=(integrator, Integrator))
    from ..dynamics.ode import METHODS
    if not isinstance(integrator.method, str) or integrator.method not in METHODS:
        fail("method", f"must be one of {', '.join(METHODS)}", integrator.method)
    for name in ("dt", "rtol", "atol"):
        check_number(getattr(integrator, name), name, above=0.0)
    return integrator


def check_path(value: object, param: str, optional: bool = True) -> Path | None:
    """A file or folder name (str or path-like; None when ``optional``), as a Path."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        fail(param, "must be a file or folder name (a str or pathlib.Path)", value)
    if not str(value).strip():
        raise OutputError(f"{param}: must be a file or folder name (got an empty or blank "
                          "path)")
    return Path(value)


def check_run(run: object) -> Run:
    """The Run options: progress a switch, jobs an integer >= 1, the scheduler None or a
    name (its form is checked by the verbs that use it), limits a Limits."""
    if not isinstance(run, Run):
        raise ValidationError(f"run: must be a theory_kit.options.Run (got {type(run).__name__})")
    check_flag(run.progress, "progress")
    check_int(run.jobs, "jobs", 1)
    if run.scheduler is not None and not isinstance(run.scheduler, str):
        fail("scheduler", "must be None, 'local' or 'tcp://HOST:PORT'", run.scheduler)
    if not isinstance(run.limits, limits.Limits):
        fail("limits", "must be a theory_kit.options.Limits", run.limits)
    check_flag(run.limits.allow_long, "allow_long")
    return run


def check_options(**given: tuple[object, type]) -> None:
    """Each option object of the right type (``rates=(rates, Rates)``), before it is used."""
    for name, (value, cls) in given.items():
        if not isinstance(value, cls):
            raise ValidationError(f"{name}: must be a theory_kit.options.{cls.__name__} (got "
                                  f"{type(value).__name__})")


def check_scales(**values: float | None) -> None:
    """Rates and scales (γ, γ_a, γ_b, η): at most :data:`MAX_SCALE` in size; the verbs check
    their own sign and finiteness."""
    for name, value in values.items():
        if isinstance(value, (int, float)) and abs(value) > MAX_SCALE:
            raise ValidationError(f"{name}: must be at most {MAX_SCALE:g} in size (its square "
                                  f"overflows float64 otherwise; got {value:g})")


def call_options(frame_locals: dict, *, drop: tuple[str, ...] = ("run", "out")) -> dict:
    """The arguments of a verb's call (its ``locals()`` on entry), without those that only
    change how it runs: the request of a stored result."""
    return {k: v for k, v in frame_locals.items() if k not in drop and not k.startswith("_")}


@contextmanager
def running(run: Run) -> Iterator[Run]:
    """Hold the call's limits and progress setting while the verb runs."""
    check_run(run)
    with limits.applied(run.limits), progress.hidden(not run.progress):
        yield run

