"""The verbs that evaluate errors: E at one state and the Bayes floor; the task and activation
building blocks."""
from __future__ import annotations

import numpy as np

from ..expect import error as expect_error
from ..expect.error import ErrorValue
from ..model.activations import Activation, custom_activation, get_activation
from ..model.phi_parser import refuse_non_finite
from ..model.priors import make_prior
from ..model.state import check_state_for_task
from ..model.task import Task
from ..model.validation import ValidationError, check_choice
from ..options import Run
from .inputs import (
    ActivationLike,
    ArrayLike,
    as_activation,
    as_state,
    as_task,
    running,
)


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
    check_choice(method, "method", expect_error.METHODS)
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
    check_choice(method, "method", expect_error.METHODS)
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        result = expect_error.bayes_error(the_task, method=method)
    return result.with_params({"task": the_task.params()})
