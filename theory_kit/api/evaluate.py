"""The verbs that evaluate the theory at one point: E, E_Bayes, the derivation, the drift."""
from __future__ import annotations

import numpy as np

from ..dynamics.ode import build_system, drift_at_state
from ..expect import error as expect_error
from ..expect.engines import build_engine
from ..expect.error import ErrorValue
from ..io.result import Derivation, Drift
from ..kernels import codegen
from ..model.activations import Activation, custom_activation, get_activation
from ..model.phi_parser import refuse_non_finite
from ..model.priors import make_prior
from ..model.state import check_state_for_task
from ..model.task import Task
from ..model.validation import ValidationError, check_int, fail
from ..options import Rates, Run
from ..symbolic import derive as symbolic
from .inputs import (
    ActivationLike,
    ArrayLike,
    EngineLike,
    as_activation,
    as_engine,
    as_state,
    as_task,
    check_options,
    check_scales,
    running,
)

FORMATS = ("markdown", "latex", "python")


def task(L: int, prior: str = "flipping", nu: ArrayLike = (2.0, 2.0),
         delta: float = 0.0) -> Task:
    """The data law of docs/theory.md §1.

    Parameters
    ----------
    L : int
        Sequence length, >= 2.
    prior : str
        ``flipping`` or ``gaussian`` (``discrete`` and ``empirical`` through
        :func:`theory_kit.model.priors.make_prior`).
    nu : array_like, shape (F,)
        Signal strengths ν_f > 0 (E θ_f² = ν_f).
    delta : float
        Label noise Δ >= 0.

    Returns
    -------
    Task

    Examples
    --------
    >>> task(4, "flipping", [2, 2]).F
    2
    """
    return Task(L, make_prior(prior, nu=nu), delta)


def activation(name: str | None = None, *, phi: str | None = None, norm: str = "per-head",
               kappa: float = 0.0, offset: str = "none") -> Activation:
    """A preset, or a user activation φ(s) with its normalisation (docs/theory.md §3).

    σ_hl = a_h φ(s_hl + b_h + o_h) / N with N = 1 (``elementwise``), N_h = κ + Σ_l φ
    (``per-head``) or κ + Σ_{h,l} φ (``joint``).  φ is parsed by a whitelist, never evaluated.

    Parameters
    ----------
    name : str, optional
        A preset: softmax, softmax1, bsoftmax, linear, relu, sigmoid, erf.
    phi : str, optional
        A user φ as an expression in s, e.g. ``"log(1+exp(s))"``.
    norm, kappa, offset
        With ``phi``: the normalisation, κ >= 0 and the offsets (``none`` or ``bayes``).

    Examples
    --------
    >>> activation("softmax1").kappa
    1.0
    >>> activation(phi="softplus(s)", kappa=0.5).norm
    'per-head'
    """
    if (name is None) == (phi is None):
        raise ValidationError("activation: give either a preset name or phi, not both or "
                              "neither")
    if name is not None:
        return get_activation(name)
    return custom_activation(phi, norm=norm, kappa=kappa, offset=offset)


def error(activation: ActivationLike, *, L: int, nu: ArrayLike, M: ArrayLike, Q: ArrayLike,
          a: ArrayLike | None = None, b: ArrayLike | None = None, prior: str = "flipping",
          delta: float = 0.0, method: str = "auto", run: Run = Run()) -> ErrorValue:
    """Population error E(M, Q, a, b) = Δ + E|δ_ε − w|² (docs/theory.md §4).

    Parameters
    ----------
    activation : str or Activation
    L, nu, prior, delta
        The task (see :func:`task`).
    M : array_like, shape (H, F)
        Overlaps m_hf = k_h · u_f.
    Q : array_like, shape (H, H)
        Gram matrix of the keys (Q and Q − M Mᵀ positive semi-definite).
    a, b : array_like, shape (H,), optional
        Output weights and score biases (default: the activation's presets).
    method : str
        ``auto`` (quad when it applies), ``quad``, ``mc`` or ``mpmath``.
    run : Run
        Resource limits.

    Returns
    -------
    ErrorValue
        ``value`` ± ``abs_err`` (an honest numerical error) and the ``method``.

    Examples
    --------
    >>> r = error("softmax", L=4, nu=[2, 2], M=[[1.0, 0.8], [0.9, -0.7]],
    ...           Q=[[2.0, 0.3], [0.3, 1.8]], method="quad")
    >>> round(r.value, 8), r.abs_err < 1e-8
    (0.49225658, True)
    """
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        state = as_state(act, the_task, M, Q, a, b)
        check_state_for_task(state, the_task)
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite E is refused below
            result = expect_error.population_error(the_task, act, state, method=method)
        refuse_non_finite(act, "the population error", result.value)
    return result.with_params({"activation": act.params(), "task": the_task.params(),
                               "state": state.to_dict()})


def bayes_error(*, L: int, nu: ArrayLike, prior: str = "flipping", delta: float = 0.0,
                method: str = "auto", run: Run = Run()) -> ErrorValue:
    """The Bayes-optimal error E_Bayes = Δ + 1 − E Σ_l p_l² of the task (docs/theory.md §4).

    Parameters
    ----------
    L, nu, prior, delta
        The task (see :func:`task`).
    method : str
        ``auto``, ``quad``, ``mc`` or ``mpmath``.
    run : Run
        Resource limits.

    Returns
    -------
    ErrorValue
        E_Bayes ± its numerical error and the method.

    Examples
    --------
    >>> round(bayes_error(L=4, nu=[2, 2], method="quad").value, 9)
    0.342927799
    """
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        result = expect_error.bayes_error(the_task, method=method)
    return result.with_params({"task": the_task.params()})


def derive(activation: ActivationLike, *, format: str = "markdown") -> Derivation:
    """The symbolic derivation of the drift integrands, or the generated source.

    Parameters
    ----------
    activation : str or Activation
    format : str
        ``markdown`` or ``latex`` (φ, its derivatives, the weights, J·e, J·J, the Stein
        term and the drifts), or ``python`` (the generated NumPy module).

    Returns
    -------
    Derivation
        Its ``text``; rendered as Markdown in a notebook.

    Examples
    --------
    >>> "phi" in derive("softmax1").text.lower()
    True
    """
    if format not in FORMATS:
        fail("format", f"must be one of {', '.join(FORMATS)}", format)
    act = as_activation(activation)
    text = codegen.module_source(act) if format == "python" else symbolic.render(act, format)
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
    check_options(rates=(rates, Rates))
    check_scales(gamma=gamma, gamma_a=rates.gamma_a, gamma_b=rates.gamma_b)
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
        built = system.engine = build_engine(
            options.name, the_task, act, state.H, samples=options.samples,
            seed=check_int(options.seed, "mc-seed", 0), fresh=options.fresh,
            head_symmetric=options.symmetric_heads, state=state)
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite drift is refused
            out = drift_at_state(system, system.join(state.M, state.Q, state.a, state.b))
        refuse_non_finite(act, "the drift", out["dM"], out["dQ"], out["da"], out["db"],
                          out["error"])
    out["engine"] = built.params()
    probe = getattr(built, "probe", None)        # set by auto (``engines.SelectedEngine``)
    if probe is not None:
        out["engine_probe"] = probe
    out["params"] = {"activation": act.params(), "task": the_task.params(),
                     "state": state.to_dict(), **resolved}
    return Drift(out)
