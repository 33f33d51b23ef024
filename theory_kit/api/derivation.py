"""The verbs of the derivation: the symbolic drift integrands, and the drift at one state."""
from __future__ import annotations

import numpy as np

from .. import kernels
from ..dynamics.ode import build_system, drift_at_state
from ..expect.engines import engine_from_options
from ..io.result import Derivation, Drift
from ..model.phi_parser import refuse_non_finite
from ..model.state import check_state_for_task
from ..model.validation import check_choice, check_flag, check_number, fail
from ..options import Rates, Run
from ..symbolic import derive as symbolic
from .inputs import (
    MAX_SCALE,
    ActivationLike,
    ArrayLike,
    EngineLike,
    as_activation,
    as_engine,
    as_state,
    as_task,
    check_rates,
    running,
)

FORMATS = ("markdown", "latex", "python")


def derive(activation: ActivationLike, *, format: str = "markdown",
           backend: str | kernels.KernelBackend = "numpy") -> Derivation:
    """The symbolic derivation of the drift integrands, or the generated source.

    Parameters
    ----------
    activation : str or Activation
    format : str
        ``markdown`` or ``latex`` (φ, its derivatives, the weights, J·e, J·J, the Stein
        term and the drifts), or ``python`` (the generated module).
    backend : str or KernelBackend
        With ``format="python"``: whose module, ``numpy`` (default) or ``numba``, or any
        registered backend (:func:`theory_kit.kernels.backend_names`).

    Returns
    -------
    Derivation
        Its ``text``; rendered as Markdown in a notebook.

    Examples
    --------
    >>> "phi" in derive("softmax1").text.lower()
    True
    """
    check_choice(format, "format", FORMATS)
    if not isinstance(backend, kernels.KernelBackend) and backend not in kernels.backend_names():
        fail("backend", f"must be one of {', '.join(kernels.backend_names())}", backend)
    act = as_activation(activation)
    text = (kernels.generate_source(act, backend) if format == "python"
            else symbolic.render(act, format))
    return Derivation({"text": text + "\n", "format": format,
                       "params": {"activation": act.params()}})


def drift(activation: ActivationLike, *, L: int, nu: ArrayLike, M: ArrayLike, Q: ArrayLike,
          gamma: float, a: ArrayLike | None = None, b: ArrayLike | None = None,
          prior: str = "flipping", delta: float = 0.0, gradient_flow: bool = False,
          rates: Rates = Rates(), engine: EngineLike = "auto", run: Run = Run()) -> Drift:
    """The ODE's right-hand side at one state (docs/theory.md §5), with error estimates.

    Exactly ``OdeSystem.rhs`` at that state: the check users run on a fixed point.

    Parameters
    ----------
    activation, L, nu, prior, delta
        The activation and the task.
    M, Q, a, b
        The state: M (H, F), Q (H, H), a, b (H,) (default: the activation's presets).
    gamma : float
        Learning rate γ > 0.
    gradient_flow : bool
        Drop the γ² noise term.
    rates : Rates
        Training switches and rates of a, b.
    engine : str or Engine
        The expectation engine (default ``auto``).
    run : Run
        Progress bars (auto's probe can take a while) and resource limits.

    Returns
    -------
    Drift
        dM (H, F), dQ (H, H) with the γ² term, da, db (H,), E at the state, the per-field
        error estimates ``errors`` and the largest, ``abs_err``.

    Examples
    --------
    >>> d = drift("softmax", L=3, nu=[2, 2], M=[[0.6, 0.15], [0.5, -0.1]],
    ...           Q=[[1.3, 0.2], [0.2, 1.1]], gamma=1.0, engine="laplace")
    >>> d.dM.shape, d.abs_err < 1e-6
    ((2, 2), True)
    """
    check_rates(rates)
    check_number(gamma, "gamma", above=0.0, maximum=MAX_SCALE)
    check_flag(gradient_flow, "gradient_flow")
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        state = as_state(act, the_task, M, Q, a, b)
        check_state_for_task(state, the_task)
        options = as_engine(engine)
        # the rates are validated before the engine is built (auto's probe is not free): no
        # engine yet, it is set just below
        system, resolved = build_system(the_task, act, state.H, None,  # type: ignore[arg-type]
                                        gamma, rates.train_a, rates.train_b, rates.gamma_a,
                                        rates.gamma_b, gradient_flow, rescale_time=False)
        built = system.engine = engine_from_options(options, the_task, act, state.H, state)
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite drift is refused
            out = drift_at_state(system, system.join(state.M, state.Q, state.a, state.b))
        refuse_non_finite(act, "the drift", out["dM"], out["dQ"], out["da"], out["db"],
                          out["error"])
    out["engine"] = built.params()
    accuracy = getattr(built, "accuracy", None)  # rqmc: the points and the error it reached
    if accuracy is not None:
        out["accuracy"] = accuracy()
    probe = getattr(built, "probe", None)        # set by auto (``engines.SelectedEngine``)
    if probe is not None:
        out["engine_probe"] = probe
    out["params"] = {"activation": act.params(), "task": the_task.params(),
                     "state": state.to_dict(), **resolved}
    return Drift(out)
