"""Population error E(M, Q, a, b) and the Bayes error (THEORY §4).

Averaging over the values c_l gives, with e = δ_ε − w,

    E = Δ + E_{θ,ε,z}[ (1 − w_ε)² + Σ_{l≠ε} w_l² ],

and the Bayes-optimal predictor has E_Bayes = Δ + 1 − E[Σ_l p_l²] with
p_l = g(Uᵀx_l)/Σ_{l'} g(Uᵀx_{l'}), g(p) = E_θ exp(θ·p − |θ|²/2).

Methods: ``mc`` (Monte Carlo, seeded, standard error), ``quad`` (deterministic quadrature on
the Laplace-reduced integrals, see ``expect.quadrature``), ``mpmath`` (≥ 30 digits, small
cases), ``auto`` (the most accurate one that is fast for the case at hand).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .activations import Activation
from .expect import montecarlo as mc
from .model import State, Task, ValidationError, check_state_for_task, fail

METHODS = ("auto", "quad", "mc", "mpmath")


@dataclass(frozen=True)
class ErrorResult:
    """A number with an honest estimate of its numerical error and how it was computed."""

    value: float
    abs_err: float
    method: str
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"error": self.value, "abs_err": self.abs_err, "method": self.method,
                **self.details}


def _check_method(method: str) -> None:
    if method not in METHODS:
        fail("method", f"must be one of {', '.join(METHODS)}", method)


def squared_residual(w: np.ndarray) -> np.ndarray:
    """|e|² = (1 − w_0)² + Σ_{l≥1} w_l² with the signal at token 0; w of shape (n, L)."""
    return (1.0 - w[:, 0]) ** 2 + np.sum(w[:, 1:] ** 2, axis=1)


def population_error_mc(task: Task, act: Activation, state: State, n: int = 200_000,
                        seed: int = 0) -> ErrorResult:
    """Monte Carlo estimate of E with its standard error (θ stratified, see ``expect.montecarlo``)."""
    rng = np.random.default_rng(seed)
    total, sq = 0.0, 0.0
    chunk = max(1, min(n, 2_000_000 // max(1, state.H * task.L * 8)))
    done = 0
    means, errs = [], []
    while done < n:
        m = min(chunk, n - done)
        smp = mc.draw_samples(task.prior, state.H, task.L, m, rng)
        S, _ = mc.scores(smp, state.M, state.Q)
        _, w = act.weights(S, state.a, state.b, np.diag(state.Q))
        mean, se = mc.weighted_mean(smp, squared_residual(w))
        means.append((m, float(mean)))
        errs.append((m, float(se)))
        done += m
    total = sum(k * v for k, v in means) / n
    sq = np.sqrt(sum((k * e) ** 2 for k, e in errs)) / n
    return ErrorResult(task.delta + total, float(sq), "mc", {"n_samples": n, "seed": seed})


def population_error(task: Task, act: Activation, state: State, method: str = "auto",
                     **kwargs: object) -> ErrorResult:
    """E(M, Q, a, b) for activation ``act`` on ``task`` by the chosen method."""
    _check_method(method)
    check_state_for_task(state, task)
    if method == "mc":
        return population_error_mc(task, act, state, **kwargs)  # type: ignore[arg-type]
    raise ValidationError(f"method: '{method}' is not available yet for the population error")


def bayes_error(task: Task, method: str = "auto", **kwargs: object) -> ErrorResult:
    """E_Bayes = Δ + 1 − E[Σ_l p_l²] for the task's prior."""
    _check_method(method)
    raise ValidationError(f"method: '{method}' is not available yet for the Bayes error")
